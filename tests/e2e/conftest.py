"""One local Ray cluster and one deployed service for the whole e2e session.

Ray starts with more logical CPUs than the machine has cores so that a 2-worker job, its
driver and the service fit at once; every e2e test shares this cluster, because each Ray start
costs seconds here.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    dashboard_port = _free_port()
    ray.init(
        # Always a fresh cluster of our own, never one a stale `ray start` left behind.
        address="local",
        num_cpus=8,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        log_to_driver=False,
        configure_logging=False,
    )
    yield {"dashboard_url": f"http://127.0.0.1:{dashboard_port}"}
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def service(ray_cluster, tmp_path_factory):
    """The service on Ray Serve, with its own EFT_HOME. Yields its settings as a dict, with
    `restart(**overrides)` to restart it with some settings changed (and back with none)."""
    from ray import serve

    from service.local import deploy_app, wait_healthy

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
        job = httpx.get(f"{url}/jobs/{job_id}", timeout=30).json()
        if job["status"] in statuses:
            return job
        if job["status"] in terminal:
            events = httpx.get(f"{url}/jobs/{job_id}/events", timeout=30).json()["data"]
            pytest.fail(f"job ended {job['status']}: {job.get('error')}\n{events}")
        time.sleep(0.5)
    pytest.fail(f"job {job_id} did not reach {statuses} in {timeout_s}s; last: {job['status']}")
