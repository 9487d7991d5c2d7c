"""Pause and resume through the real app and store (no Ray: the workers' side is the
reporter the training loop asks, exercised in tests/training/test_strategies.py)."""

from __future__ import annotations

import json

import pytest

from eft.service.runs.reporter import StoreReporter
from eft.types.jobs import JobStatus


@pytest.fixture
def job(service, eft_home):
    client, store, settings = service
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    created = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl"}).json()
    store.transition(created["id"], JobStatus.queued, "validated")
    return created["id"]


def _events(client, job_id):
    return [e["type"] for e in client.get(f"/jobs/{job_id}/events").json()["data"]]


def test_a_running_job_pauses_through_its_workers_and_resumes(service, job):
    client, store, settings = service
    store.transition(job, JobStatus.running, "dispatched", attempt=1)
    reporter = StoreReporter(settings.resolved_database_url, job, 1)
    assert not reporter.pause_requested()
    paused = client.post(f"/jobs/{job}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "pausing"
    assert reporter.pause_requested()
    assert not StoreReporter(settings.resolved_database_url, job, 2).pause_requested()  # another attempt's
    assert client.post(f"/jobs/{job}/pause").json()["status"] == "pausing"  # asked twice: the same
    assert reporter.paused(3)  # the workers checkpointed at step 3 and stopped
    got = client.get(f"/jobs/{job}").json()
    assert got["status"] == "paused" and got["step"] == 3
    assert client.get("/v1/fine_tuning/jobs/" + job).json()["status"] == "paused"
    resumed = client.post(f"/jobs/{job}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    assert _events(client, job)[-4:] == ["dispatched", "pause_requested", "paused", "resume_requested"]
    again = client.post(f"/jobs/{job}/resume")
    assert again.status_code == 409 and again.json()["error"]["code"] == "job_not_paused"
    assert "queued" in again.json()["error"]["message"]


def test_a_queued_job_pauses_at_once_and_v1_speaks_openais_shape(client, job):
    paused = client.post(f"/v1/fine_tuning/jobs/{job}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert paused.json()["object"] == "fine_tuning.job"
    resumed = client.post(f"/v1/fine_tuning/jobs/{job}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"


def test_jobs_that_cannot_pause_say_why(service, job):
    client, store, _ = service
    store.transition(job, JobStatus.running, "dispatched", attempt=1)
    store.transition(job, JobStatus.succeeded, "done", artifact_path="/tmp/x")
    refused = client.post(f"/jobs/{job}/pause")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "job_not_pausable" and "succeeded" in error["message"] and error["param"] == "job_id"
    assert client.post("/jobs/ftjob-nope/pause").status_code == 404


def test_a_paused_job_can_be_cancelled_and_a_pause_can_still_end_otherwise(service, job):
    client, store, settings = service
    assert client.post(f"/jobs/{job}/pause").json()["status"] == "paused"
    assert client.post(f"/jobs/{job}/cancel").json()["status"] == "cancelled"
    # A pausing job whose run finishes before its next check succeeds as usual.
    other = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl"}).json()["id"]
    store.transition(other, JobStatus.queued, "validated")
    store.transition(other, JobStatus.running, "dispatched", attempt=1)
    client.post(f"/jobs/{other}/pause")
    assert StoreReporter(settings.resolved_database_url, other, 1).succeeded("/tmp/artifact", {"loss": 1.0}, 6)
    assert client.get(f"/jobs/{other}").json()["status"] == "succeeded"


def test_a_paused_job_holds_no_quota_and_its_resume_is_checked_against_it(service, job):
    """A paused job does not count against its tenant's active jobs (another may run meanwhile),
    so resuming it takes quota again: over the limit it is a 429 naming the limit and the job
    stays paused; once room frees it resumes."""
    from eft.service.accounts.quotas import set_tenant_limits

    client, store, _ = service
    tenant = store.get_job(job).tenant
    assert client.post(f"/jobs/{job}/pause").json()["status"] == "paused"
    set_tenant_limits(store, tenant, max_active_jobs=1)
    other = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl"})
    assert other.status_code == 201, other.text
    refused = client.post(f"/jobs/{job}/resume")
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded" and int(refused.headers["retry-after"]) >= 1
    assert client.get(f"/jobs/{job}").json()["status"] == "paused"
    assert client.post(f"/jobs/{other.json()['id']}/cancel").status_code == 200
    assert client.post(f"/jobs/{job}/resume").json()["status"] == "queued"


def test_an_owners_pause_holds_a_job_the_scheduler_had_paused(service, job):
    """The scheduler pauses a job to make room and queues it again once room frees; if its owner
    pauses it meanwhile, it stays paused until the owner resumes it."""
    from eft.service.scheduling.queueing import scheduler_paused

    client, store, _ = service
    store.transition(job, JobStatus.running, "dispatched", attempt=1)
    store.set_schedule(job, {"workers": 0, "paused": True, "reason": "room for a high-priority job"})
    store.transition(job, JobStatus.pausing, "paused by the scheduler")
    store.transition(job, JobStatus.paused, "paused", expected_attempt=1)
    assert scheduler_paused(store.get_job(job))
    assert client.post(f"/jobs/{job}/pause").json()["status"] == "paused"
    assert not scheduler_paused(store.get_job(job))  # the scheduler leaves it where its owner put it
    assert client.post(f"/jobs/{job}/resume").json()["status"] == "queued"
