"""Journey: tenants sharing one service and one cluster, over real HTTP: two tenants of equal weight
each get half of the spot slots whoever came first; two service replicas on one PostgreSQL queue
dispatch every job exactly once, and a restart of the service while one job runs and one waits
loses neither (a restart of one replica is tested in-process on SQLite and PostgreSQL:
tests/integration/test_service_restart.py).
"""

from __future__ import annotations

import pytest

from tests.helpers.databases import postgres_schema_url
from tests.helpers.jobs import SPOT, events_of, fetch, lora_body, post, step_at_least, trained_steps, until
from tests.helpers.service_api import as_json, client, key_for, used_later, wait_for



def test_two_tenants_with_equal_weights_each_get_half_the_slots(service, spot_nodes):
    """Two spot slots, two tenants of equal weight with two one-worker jobs each, all queued
    behind a job that holds both slots: once the slots free, each tenant gets one, although
    one tenant's jobs all came first; the others wait, saying why."""
    from eft import Client

    url = service["url"]
    spot = {"resources": {SPOT: 1}}
    spot_nodes.start()
    spot_nodes.start()
    blocker = post(url, lora_body("blocker", 2000, workers=2, scaling=spot))
    until("the blocker on both slots", lambda: step_at_least(url, blocker["id"], 1))
    tenants = {t: Client(base_url=url, api_key=key_for(service["home"], t), timeout=60) for t in ("team-a", "team-b")}
    # Team a's jobs arrive first: first come, first served would give it both slots.
    posted = [(t, as_json(tenants[t].jobs.create(lora_body(f"{t}-{i % 2}", 2000, workers=1, scaling=spot))))
              for i, t in enumerate(("team-a", "team-a", "team-b", "team-b"))]

    def job(tenant: str, job_id: str) -> dict:
        return as_json(tenants[tenant].jobs.retrieve(job_id))

    until("the four queued with a reason", lambda: all(
        (j := job(t, p["id"]))["status"] == "queued" and j.get("queue") for t, p in posted))
    line = job("team-b", posted[2][1]["id"])["queue"]
    assert "does not fit now" in line["reason"] and "cpu+eft_test_spot" in line["reason"], line
    client(url).jobs.cancel(blocker["id"])
    running = until("two of them running", lambda: (
        r if len(r := [(t, p["id"]) for t, p in posted if job(t, p["id"])["status"] == "running"]) >= 2 else None))
    assert sorted(t for t, _ in running) == ["team-a", "team-b"], running
    # The two that wait stay queued while the slots are taken, one of each tenant.
    waiting = [(t, p["id"]) for t, p in posted if (t, p["id"]) not in running]
    assert sorted(t for t, _ in waiting) == ["team-a", "team-b"]
    assert all(job(t, i)["status"] == "queued" for t, i in waiting)
    for tenant, posted_job in posted:
        tenants[tenant].jobs.cancel(posted_job["id"])
    until("every job cancelled", lambda: all(job(t, p["id"])["status"] == "cancelled" for t, p in posted)
           and fetch(url, blocker["id"])["status"] == "cancelled", timeout_s=120)


@pytest.fixture
def two_replicas(service, request):
    """The service as two replicas on one PostgreSQL queue, with at most one job running in the
    cluster; `redeploy()` restarts both (a service restart). Back to the session's after, where
    a later test uses it."""
    from ray import serve

    from eft.api.local import deploy_app, wait_healthy
    from eft.api.serve_config import APP_NAME

    with postgres_schema_url("eft_e2e") as database_url:
        env = {**service["env"], "EFT_DATABASE_URL": database_url, "EFT_MAX_RUNNING_JOBS": "1"}

        def redeploy() -> None:
            serve.delete(APP_NAME)
            deploy_app(env, num_replicas=2)
            wait_healthy(service["url"])

        redeploy()
        try:
            yield {**service, "redeploy": redeploy}
        finally:
            if used_later(request):
                service["restart"]()


@pytest.mark.postgres
def test_two_replicas_dispatch_every_job_once_and_a_restart_loses_none(two_replicas):
    """Two service replicas, each with its own scheduler claiming from the same `jobs` table,
    and at most one job running: one job runs and one waits; the service restarts (both
    replicas) while they do, and neither notices. Every job is dispatched exactly once (one
    `dispatched` and one `submitted` event, attempt 1, one Ray Job), trains every step once, and
    the waiting one starts only once the running one has finished."""
    from ray import serve
    from ray.job_submission import JobSubmissionClient

    url = two_replicas["url"]
    replicas = serve.status().applications["eft"].deployments["EftService"].replica_states
    assert replicas.get("RUNNING") == 2, replicas
    running = post(url, lora_body("runs-through-restarts", 300, workers=1))
    waiting = post(url, lora_body("waits-through-restarts", 40, workers=1))
    until("the first job to train", lambda: step_at_least(url, running["id"], 5))
    assert fetch(url, waiting["id"])["status"] == "queued"

    two_replicas["redeploy"]()
    assert fetch(url, waiting["id"])["status"] == "queued"
    assert fetch(url, running["id"])["status"] == "running"
    done = [wait_for(j["id"], url, {"succeeded"}) for j in (running, waiting)]

    ray_jobs = JobSubmissionClient(two_replicas["dashboard_url"]).list_jobs()
    for job in done:
        assert job["attempt"] == 1 and job["restarts"] == 0
        types = [e["type"] for e in events_of(url, job["id"])]
        assert types.count("dispatched") == 1 and types.count("submitted") == 1, types
        assert types.count("training_started") == 1, types
        assert types[:4] == ["created", "queued", "dispatched", "submitted"]
        assert types[-1] == "succeeded"
        assert sorted(set(trained_steps(url, job["id"]))) == list(range(1, job["total_steps"] + 1))
        submissions = [r for r in ray_jobs if (r.metadata or {}).get("eft_job_id") == job["id"]]
        assert [r.submission_id for r in submissions] == [f"{job['id']}-attempt-1"]
    # The waiting job only started once the running one had finished.
    assert done[1]["started_at"] >= done[0]["finished_at"]
