"""Talking to a deployed service over HTTP, as the e2e journeys do: the one raw HTTP client (its
credentials set in one place), the `eft.Client` per URL, tenant keys made in the service's store,
and waiting for a job to reach a status."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel

from eft import Client

# The one HTTP client tests talk to the service with (absolute URLs), so that headers the service
# requires, such as credentials, are set in one place (`use_admin_key`).
api = httpx.Client(timeout=60)
ADMIN_KEY = "eft-e2e-admin-" + secrets.token_urlsafe(16)
_CLIENTS: dict[str, Client] = {}


def use_admin_key() -> str:
    """Make `api` call as the deployments' bootstrap admin; returns the key to deploy with."""
    api.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
    return ADMIN_KEY


def client(url: str) -> Client:
    """The `eft.Client` the tests drive the service at `url` with, as the deployments' bootstrap
    admin (tenant "default"). Raw HTTP (`api`) is kept for what the client does not expose."""
    if url not in _CLIENTS:
        _CLIENTS[url] = Client(base_url=url, api_key=ADMIN_KEY, timeout=60)
    return _CLIENTS[url]


def key_for(home: Path, tenant: str) -> str:
    """A user key of `tenant`, made in the service's own store (as `eft keys create` does)."""
    from eft.service.accounts.auth import KeyStore
    from eft.service.settings import Settings
    from eft.service.store.store import Store

    store = Store(Settings(home=home, database_url=None).resolved_database_url)
    try:
        return KeyStore(store.engine).create(tenant, "user", name="e2e")[1]
    finally:
        store.close()


def as_json(model: BaseModel) -> dict:
    """A client answer as the JSON the REST API sent."""
    return model.model_dump(mode="json")


def free_port() -> int:
    """A port for a server to bind soon (api/local.py:listen_ports)."""
    from eft.api.local import listen_ports

    return listen_ports(1)[0]


def wait_for(job_id: str, url: str, statuses: set[str], timeout_s: float = 420) -> dict:
    """Poll a job until its status is in `statuses`; fail with its events if it ends elsewhere.
    `timeout_s` is stretched on a machine slower than the budgets' (budgets.py:machine_factor)."""
    from tests.helpers.budgets import machine_factor

    timeout_s *= machine_factor()
    deadline = time.monotonic() + timeout_s
    terminal = {"succeeded", "failed", "cancelled"}
    while time.monotonic() < deadline:
        job = as_json(client(url).jobs.retrieve(job_id))
        if job["status"] in statuses:
            return job
        if job["status"] in terminal:
            events = as_json(client(url).jobs.list_events(job_id, limit=1000))["data"]
            pytest.fail(f"job ended {job['status']}: {job.get('error')}\n{events}")
        time.sleep(0.5)
    pytest.fail(f"job {job_id} did not reach {statuses} in {timeout_s:.0f}s; last: {job['status']}")


def used_later(request, fixture: str = "service") -> bool:  # noqa: ANN001 - pytest's FixtureRequest
    """Whether a test after the current one uses `fixture`: a fixture that changed the session's
    service restores it only then (a restart costs seconds of Serve's time)."""
    items = request.session.items
    later = items[items.index(request.node) + 1:] if request.node in items else items
    return any(fixture in item.fixturenames for item in later)
