"""The service's side of training's reporter protocol, over a real store: every report lands,
fenced by the attempt, and the reporter crosses process boundaries without its connection.

Run: .venv/bin/python -m pytest tests/integration/test_reporter.py -q
"""

from __future__ import annotations

import pickle

import pytest

from eft.service.runs.reporter import StoreReporter
from eft.service.store.store import Store
from eft.training.reporting import Reporter
from eft.types.jobs import JobStatus
from tests.helpers.store import running_job


@pytest.fixture
def running(database_url):
    store = Store(database_url)
    yield store, running_job(store)
    store.close()


def test_reports_land_in_the_store(running, database_url):
    store, job_id = running
    reporter: Reporter = StoreReporter(database_url, job_id, 1)
    reporter.started(1, 2)
    assert reporter.step(2, 2) and reporter.resumed(2, 1)
    reporter.metrics(2, {"loss": 1.5, "trained_tokens": 300})
    reporter.checkpoint(2, "/ckpt/2", {"loss": 1.5}, world_size=1, reason="interval", size_bytes=10,
                        save_seconds=0.1)
    reporter.counts(restarts=1, lost_steps=3)
    reporter.event("resized", "grew", {"to_workers": 2}, level="warning")
    assert reporter.position() == (2, 300.0)
    assert reporter.succeeded("/artifacts/x", {"eval_loss": 1.0}, 4)
    job = store.get_job(job_id)
    assert (job.status, job.step, job.artifact_path, job.restarts, job.lost_steps) == (
        JobStatus.succeeded, 4, "/artifacts/x", 1, 3)
    assert [c["step"] for c in store.list_checkpoints(job_id)] == [2]
    types = [e.type for e in store.list_events(job_id)[0]]
    assert "training_started" in types and "resized" in types and types[-1] == "succeeded"


def test_a_stale_attempt_changes_nothing(running, database_url):
    store, job_id = running
    stale = StoreReporter(database_url, job_id, 1)
    store.transition(job_id, JobStatus.queued, "requeued")
    store.transition(job_id, JobStatus.running, "dispatched", attempt=2)
    assert not stale.step(3, 1) and not stale.resumed(3, 1)
    assert not stale.succeeded("/artifacts/old", {}, 4)
    events_before = [e.id for e in store.list_events(job_id)[0]]
    # Metrics, checkpoints, events and counters of the stale attempt are fenced off too.
    stale.metrics(3, {"loss": 9.0})
    stale.checkpoint(3, "/ckpt/stale", {}, world_size=1, reason="interval", size_bytes=1, save_seconds=0.1)
    stale.event("resized", "grew", {"to_workers": 2})
    stale.counts(restarts=1, lost_steps=5)
    job = store.get_job(job_id)
    assert (job.status, job.attempt, job.step, job.artifact_path) == (JobStatus.running, 2, 0, None)
    assert (job.restarts, job.lost_steps) == (0, 0)
    assert store.list_metrics(job_id) == [] and store.list_checkpoints(job_id) == []
    assert [e.id for e in store.list_events(job_id)[0]] == events_before


def test_the_reporter_pickles_without_its_connection(running, database_url):
    store, job_id = running
    shared = StoreReporter(database_url, job_id, 1, store=store)
    assert shared.store is store
    copy = pickle.loads(pickle.dumps(shared))
    assert copy._store is None and copy.store is not store
    assert copy.step(1, 1) and store.get_job(job_id).step == 1
    copy.store.close()
