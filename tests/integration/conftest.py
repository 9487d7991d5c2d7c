"""Fixtures of the integration tests: the real FastAPI app over a real SQLite store."""

import pytest
from fastapi.testclient import TestClient

from eft.api.app import create_app
from eft.service.auth import KeyStore
from eft.service.jobs import JobService
from eft.service.launcher import RayJobsLauncher
from eft.service.settings import get_settings
from eft.service.store import Store


@pytest.fixture
def client(eft_home):
    """The service's app with its own store under a fresh EFT_HOME (no Ray is contacted)."""
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = create_app(JobService(store, RayJobsLauncher(settings), settings))
    _, key = KeyStore(store.engine).create("default", "user", name="tests")
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as c:
        yield c
    store.close()
