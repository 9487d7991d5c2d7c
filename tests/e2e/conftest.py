"""The service deployed on Ray Serve once for the whole e2e session, on the process's shared
local Ray (tests/conftest.py:ray_cluster); every journey talks to it over HTTP
(tests/helpers/service_api.py)."""

from __future__ import annotations

import tomllib

import pytest

from tests.helpers.service_api import free_port, use_admin_key
from tests.helpers.spot import SpotNodes

#: The e2e tier's count of Ray Jobs against its budget, for the run's summary.
RAY_JOBS_LINE = pytest.StashKey[str]()


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
        # (the journey's 6 jobs start side by side within Ray Train's 20 s worker-group timeout
        # here).
        "EFT_MAX_RUNNING_JOBS_PER_TENANT": "6",
        "EFT_MAX_RUNNING_JOBS": "6",
        # The custom resource the spot-node tests label their nodes with.
        "EFT_ALLOWED_WORKER_RESOURCES": '["eft_test_spot"]',
        "EFT_SPOT_RESOURCES": '["eft_test_spot"]',
        # Jobs here last a minute or two: growing always pays. And on two shared cores two
        # workers are no faster than one: measured goodput would (rightly) keep an elastic job
        # at one worker, and these tests are about the resizes themselves.
        "EFT_RESIZE_COST_S": "0",
        "EFT_SCHEDULER_GOODPUT": "false",
        # The model servers take no CPU of the cluster's (training tests count them). A replica
        # stays up between the modules that chat (an idle vLLM engine costs ~5% of a core; each
        # start from zero ~30 s of both cores) and goes after the last of them.
        "EFT_INFERENCE_CPUS": "0",
        "EFT_INFERENCE_IDLE_S": "600",
        # A replica that starts from zero loads a vLLM engine (two processes importing vLLM, a
        # warm-up batch): ~30 s on a quiet machine, minutes on a loaded one. Wait for it up to just
        # under the tests' client timeout (300 s) instead of the default 120 s.
        "EFT_INFERENCE_START_TIMEOUT_S": "280",
        # Webhooks to receivers on loopback, as in local mode (`eft up`).
        "EFT_WEBHOOK_ALLOW_LOOPBACK": "true",
        "EFT_WEBHOOK_POLL_INTERVAL_S": "0.5",
        # The tests call as the deployment's bootstrap admin (tenant "default").
        "EFT_ADMIN_API_KEY": use_admin_key(),
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    deploy_app(env, port)
    wait_healthy(url)

    def restart(**overrides: str) -> None:
        serve.delete("eft")
        deploy_app({**env, **overrides})
        wait_healthy(url)

    yield {"url": url, "home": home, **ray_cluster, "env": env, "restart": restart}


@pytest.fixture(scope="session")
def journey(service):
    """Every job of the e2e tier that runs undisturbed to its end, submitted at once the first
    time a test asks (the service runs up to EFT_MAX_RUNNING_JOBS_PER_TENANT of them side by side
    and queues the rest), so that one test waiting for its job is not time the others wait too.
    Each test then waits for and asserts on its own job (`wait_for`)."""
    from tests.helpers import payloads

    submitted = payloads.submit_all(service)
    yield submitted
    submitted.close()


@pytest.fixture
def spot_nodes(service, tmp_path):
    """Spot nodes a test starts (`spot_nodes.start()`), all stopped after it."""
    import ray

    nodes = SpotNodes(ray.get_runtime_context().gcs_address, tmp_path)
    yield nodes
    nodes.stop_all()


@pytest.fixture(scope="session", autouse=True)
def ray_jobs_budget(ray_cluster, pytestconfig):
    """Fails the tier when its tests started more Ray Jobs on the session's cluster than
    tests/budgets.toml's `e2e.ray_jobs` lines allow (counted once every test ran)."""
    yield
    from ray.job_submission import JobSubmissionClient

    from tests.helpers.budgets import budgets_path

    lines = tomllib.loads(budgets_path().read_text())["e2e"]["ray_jobs"]
    allowed = sum(line["jobs"] for line in lines)
    started = JobSubmissionClient(ray_cluster["dashboard_url"]).list_jobs()
    # Shown with the tiers' times (pytest_terminal_summary below): output here is captured.
    pytestconfig.stash[RAY_JOBS_LINE] = (f"e2e: {len(started)} Ray Jobs started on the session's cluster, "
                                         f"{allowed} allowed (tests/budgets.toml)")
    assert len(started) <= allowed, (
        f"the e2e tier started {len(started)} Ray Jobs, its lines in tests/budgets.toml allow {allowed}: "
        f"assert on a journey's existing job, or add a line with the reason for a new one; started: "
        f"{sorted(j.submission_id for j in started)}")


def pytest_terminal_summary(terminalreporter, config) -> None:  # noqa: ANN001
    if line := config.stash.get(RAY_JOBS_LINE, None):
        terminalreporter.write_line(line)
