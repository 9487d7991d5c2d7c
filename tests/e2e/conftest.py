"""One local Ray cluster and one deployed service for the whole e2e session.

Ray starts with more logical CPUs than the machine has cores so that a 2-worker job, its
driver and the service fit at once; every e2e test shares this cluster, because each Ray start
costs seconds here.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel

from eft import Client

# The one HTTP client e2e tests talk to the service with (absolute URLs), so that headers the
# service requires, such as credentials, are set in one place by the `service` fixture.
api = httpx.Client(timeout=60)
ADMIN_KEY = "eft-e2e-admin-" + secrets.token_urlsafe(16)


def use_admin_key() -> str:
    """Make `api` call as the deployments' bootstrap admin; returns the key to deploy with.

    Tests import `api` and ADMIN_KEY as tests.e2e.conftest, which pytest may have loaded under
    another module name than this conftest: the header goes on that module's client too."""
    from tests.e2e import conftest as shared

    for client in {id(api): api, id(shared.api): shared.api}.values():
        client.headers["Authorization"] = f"Bearer {shared.ADMIN_KEY}"
    return shared.ADMIN_KEY


_CLIENTS: dict[str, "Client"] = {}


def client(url: str) -> Client:
    """The `eft.Client` the e2e tests drive the service with, as the deployments' bootstrap
    admin (tenant "default"). Raw HTTP (`api`) is kept for what the client does not expose."""
    from tests.e2e import conftest as shared

    if url not in _CLIENTS:
        _CLIENTS[url] = Client(base_url=url, api_key=shared.ADMIN_KEY, timeout=60)
    return _CLIENTS[url]


def key_for(home: Path, tenant: str) -> str:
    """A user key of `tenant`, made in the service's own store (as `eft keys create` does)."""
    from eft.service.auth import KeyStore
    from eft.service.settings import Settings
    from eft.service.store import Store

    store = Store(Settings(home=home, database_url=None).resolved_database_url)
    try:
        return KeyStore(store.engine).create(tenant, "user", name="e2e")[1]
    finally:
        store.close()


def as_json(model: BaseModel) -> dict:
    """A client answer as the JSON the REST API sent."""
    return model.model_dump(mode="json")


def _free_port() -> int:
    """A port for a server to bind soon (api/local.py:listen_ports)."""
    from eft.api.local import listen_ports

    return listen_ports(1)[0]


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from eft.api.local import listen_ports, ray_node_env

    # The node's processes start with the environment `eft up` gives a node (Serve's settings,
    # the workers' priority).
    os.environ.update(ray_node_env(os.environ))
    # Ports the servers bind later, picked where no outbound connection of the starting cluster
    # can take them first (api/local.py:listen_ports).
    dashboard_port, metrics_port = listen_ports(2)
    ray.init(
        # Always a fresh cluster of our own, never one a stale `ray start` left behind.
        address="local",
        num_cpus=8,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        log_to_driver=False,
        configure_logging=False,
        # The node's Prometheus endpoint, at a known port, with metrics exported every second
        # (default 10 s) so that tests see a short job's training metrics while it runs.
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    yield {"dashboard_url": f"http://127.0.0.1:{dashboard_port}",
           "ray_metrics_url": f"http://127.0.0.1:{metrics_port}/metrics"}
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def service(ray_cluster, tmp_path_factory):
    """The service on Ray Serve, with its own EFT_HOME. Yields its settings as a dict, with
    `restart(**overrides)` to restart it with some settings changed (and back with none)."""
    from ray import serve

    from eft.api.local import deploy_app, wait_healthy

    home = tmp_path_factory.mktemp("eft-home")
    (home / "data").mkdir()
    env = {
        "EFT_HOME": str(home),
        "EFT_RAY_DASHBOARD_URL": ray_cluster["dashboard_url"],
        "EFT_SCHEDULER_INTERVAL_S": "0.5",
        # Recovery reacts within seconds here (the defaults suit real clusters).
        "EFT_RESIZE_INTERVAL_S": "3",
        "EFT_PREEMPTION_POLL_INTERVAL_S": "0.5",
        "EFT_WORKER_START_TIMEOUT_S": "20",
        "EFT_DISPATCH_GRACE_S": "5",
        # Every test calls as one tenant: let it run as many jobs at once as the cluster does
        # (6 one-worker jobs start side by side within Ray Train's 20 s worker-group timeout
        # here; the families test runs 13 jobs).
        "EFT_MAX_RUNNING_JOBS_PER_TENANT": "6",
        # The custom resource the spot-node tests label their nodes with.
        "EFT_ALLOWED_WORKER_RESOURCES": '["eft_test_spot"]',
        "EFT_SPOT_RESOURCES": '["eft_test_spot"]',
        # Jobs here last a minute or two: growing always pays. And on two shared cores two
        # workers are no faster than one: measured goodput would (rightly) keep an elastic job
        # at one worker, and these tests are about the resizes themselves.
        "EFT_RESIZE_COST_S": "0",
        "EFT_SCHEDULER_GOODPUT": "false",
        # The model servers take no CPU of the cluster's (training tests count them) and
        # scale back to zero soon after the tests that chat with them.
        "EFT_INFERENCE_CPUS": "0",
        "EFT_INFERENCE_IDLE_S": "20",
        # Webhooks to receivers on loopback, as in local mode (`eft up`).
        "EFT_WEBHOOK_ALLOW_LOOPBACK": "true",
        "EFT_WEBHOOK_POLL_INTERVAL_S": "0.5",
        # The tests call as the deployment's bootstrap admin (tenant "default").
        "EFT_ADMIN_API_KEY": use_admin_key(),
    }
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    deploy_app(env, port)
    wait_healthy(url)

    def restart(**overrides: str) -> None:
        serve.delete("eft")
        deploy_app({**env, **overrides})
        wait_healthy(url)

    yield {"url": url, "home": home, **ray_cluster, "env": env, "restart": restart}


def wait_for(job_id: str, url: str, statuses: set[str], timeout_s: float = 420) -> dict:
    """Poll a job until its status is in `statuses`; fail with its events if it ends elsewhere."""
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
    pytest.fail(f"job {job_id} did not reach {statuses} in {timeout_s}s; last: {job['status']}")
