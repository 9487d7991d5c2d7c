"""The service's app in this process, as a replica wires it (no Ray is contacted), and clients
of it that call as a tenant: the one wiring every in-process API test uses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from eft.api.app import create_app
from eft.service.accounts.auth import KeyStore
from eft.service.jobs.manager import JobService
from eft.service.runs.launcher import RayJobsLauncher
from eft.service.settings import Settings
from eft.service.store.store import Store


def service_app(store: Store, settings: Settings, launcher: Any = None, models: Any = None,
                **job_service: Any) -> FastAPI:
    """The app over `store`: its jobs launched by `launcher` (Ray Jobs by default, never reached
    by these tests), chat served by `models` when given; extra arguments go to `JobService`."""
    service = JobService(store, launcher if launcher is not None else RayJobsLauncher(settings), settings,
                         **job_service)
    return create_app(service) if models is None else create_app(service, models)


def new_key(store: Store, tenant: str = "default", role: str = "user", name: str = "tests") -> str:
    """A new API key of `tenant` with `role`, made in the store as `eft keys create` does."""
    return KeyStore(store.engine).create(tenant, role, name=name)[1]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tenant_client(app: FastAPI, store: Store, tenant: str = "default", role: str = "user") -> TestClient:
    """A client of `app` that calls as a new key of `tenant` (enter it to run the app's lifespan)."""
    return TestClient(app, headers=bearer(new_key(store, tenant, role)))


def tenant_clients(app: FastAPI, store: Store, tenants: tuple[str, ...] = ("acme", "globex")) -> dict[str, TestClient]:
    """One client per tenant, each with a key of its own."""
    return {tenant: tenant_client(app, store, tenant) for tenant in tenants}


def validate_pending(store: Store, settings: Settings, validate: Any = None) -> None:
    """One validation pass of the real scheduler (dispatching paused: no Ray is contacted), its
    validation in the helper process as in a replica."""
    from eft.service.scheduling.scheduler import Scheduler
    from eft.service.requests.prepare import validate_job_isolated

    Scheduler(store, RayJobsLauncher(settings), settings.model_copy(update={"dispatch_paused": True}),
              validate or validate_job_isolated).validate_pending()
