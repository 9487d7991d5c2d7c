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
def service(eft_home):
    """The service's app with its own store under a fresh EFT_HOME (no Ray is contacted), as
    (client of tenant "default", store, settings)."""
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = create_app(JobService(store, RayJobsLauncher(settings), settings))
    _, key = KeyStore(store.engine).create("default", "user", name="tests")
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as c:
        yield c, store, settings
    store.close()


@pytest.fixture
def client(service):
    return service[0]


def validate_pending(store, settings, validate=None) -> None:
    """One validation pass of the real scheduler (dispatching paused: no Ray is contacted), its
    validation in the helper process as in a replica."""
    from eft.service.scheduler import Scheduler
    from eft.service.validation import validate_job_isolated

    Scheduler(store, RayJobsLauncher(settings), settings.model_copy(update={"dispatch_paused": True}),
              validate or validate_job_isolated).validate_pending()
