"""Fixtures of the integration tests: the real FastAPI app over a real SQLite store."""

import pytest

from eft.service.settings import get_settings
from eft.service.store.store import Store
from tests.helpers.app import service_app, tenant_client


@pytest.fixture
def service(eft_home):
    """The service's app with its own store under a fresh EFT_HOME (no Ray is contacted), as
    (client of tenant "default", store, settings)."""
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    with tenant_client(service_app(store, settings), store) as c:
        yield c, store, settings
    store.close()


@pytest.fixture
def client(service):
    return service[0]
