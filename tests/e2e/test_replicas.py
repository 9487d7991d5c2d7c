"""Two service replicas on one PostgreSQL queue: every job is dispatched exactly once.

The service runs with Serve `num_replicas=2`, each replica with its own scheduler claiming
from the same `jobs` table; every job gets one `submitted` event, attempt 1, and one Ray Job.
"""

from __future__ import annotations

import pytest

from tests.conftest import postgres_schema_url
from tests.e2e.conftest import wait_for
from tests.e2e.test_recovery import _body, _events, _post

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
JOBS = 3


@pytest.fixture
def postgres_schema():
    with postgres_schema_url("eft_e2e") as url:
        yield url


@pytest.fixture
def two_replicas(service, postgres_schema):
    from ray import serve

    from eft.api.local import deploy_app, wait_healthy
    from eft.api.serve_config import APP_NAME

    serve.delete(APP_NAME)
    deploy_app({**service["env"], "EFT_DATABASE_URL": postgres_schema}, num_replicas=2)
    wait_healthy(service["url"])
    try:
        yield service
    finally:
        service["restart"]()


def test_two_replicas_dispatch_every_job_exactly_once(two_replicas):
    from ray import serve
    from ray.job_submission import JobSubmissionClient

    url = two_replicas["url"]
    replicas = serve.status().applications["eft"].deployments["EftService"].replica_states
    assert replicas.get("RUNNING") == 2, replicas
    tiny = {"hyperparameters": {"max_steps": 3}, "checkpoint": {"every_steps": 3}}
    jobs = [_post(url, _body(f"replica-{i}", 3, workers=1, **tiny)) for i in range(JOBS)]
    done = [wait_for(j["id"], url, {"succeeded"}) for j in jobs]

    ray_jobs = JobSubmissionClient(two_replicas["dashboard_url"]).list_jobs()
    for job in done:
        assert job["attempt"] == 1 and job["restarts"] == 0
        types = [e["type"] for e in _events(url, job["id"])]
        assert types.count("dispatched") == 1 and types.count("submitted") == 1, types
        assert types.count("training_started") == 1, types
        submissions = [r for r in ray_jobs if (r.metadata or {}).get("eft_job_id") == job["id"]]
        assert [r.submission_id for r in submissions] == [f"{job['id']}-attempt-1"]
