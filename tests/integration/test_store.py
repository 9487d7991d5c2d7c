"""The job store over a real database (SQLite file and the local PostgreSQL)."""

import pytest

from eft.types.jobs import JobStatus
from eft.service.errors import Conflict, JobNotFound
from eft.service.jobs.lifecycle import IllegalTransition
from eft.service.store.store import Store

REQUEST = {"model": "tiny-llama", "training_file": "demo/chat_train.jsonl"}


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    yield s
    s.close()


def test_create_starts_validating_with_an_event(store):
    job = store.create_job(tenant="t1", request=REQUEST, name="n")
    assert job.status is JobStatus.validating and job.id.startswith("ftjob-")
    events, _ = store.list_events(job.id)
    assert [e.type for e in events] == ["created"]


def test_transition_updates_fields_and_appends_event(store):
    job = store.create_job(tenant="t1", request=REQUEST)
    store.transition(job.id, JobStatus.queued, "ok", total_steps=7, data={"n": 3})
    job = store.transition(job.id, JobStatus.running, "go", attempt=1)
    assert (job.status, job.attempt, job.total_steps) == (JobStatus.running, 1, 7)
    done = store.transition(job.id, JobStatus.succeeded, "done", expected_attempt=1,
                            artifact_path="/a", result_metrics={"eval_loss": 1.5})
    assert done.finished_at is not None and done.result_metrics == {"eval_loss": 1.5}
    events, _ = store.list_events(job.id)
    assert [e.type for e in events] == ["created", "queued", "dispatched", "succeeded"]
    assert events[1].data == {"n": 3} and events[2].attempt == 1


def test_forbidden_transition_changes_nothing(store):
    job = store.create_job(tenant="t1", request=REQUEST)
    with pytest.raises(IllegalTransition):
        store.transition(job.id, JobStatus.succeeded)
    assert store.get_job(job.id).status is JobStatus.validating
    assert len(store.list_events(job.id)[0]) == 1


def test_stale_attempt_is_fenced_off(store):
    job = store.create_job(tenant="t1", request=REQUEST)
    store.transition(job.id, JobStatus.queued)
    store.transition(job.id, JobStatus.running, attempt=2)
    with pytest.raises(Conflict):
        store.transition(job.id, JobStatus.failed, "old driver", expected_attempt=1)
    assert not store.update_job(job.id, attempt=1, step=99)
    assert store.get_job(job.id).step == 0


def test_tenants_do_not_see_each_other(store):
    job = store.create_job(tenant="t1", request=REQUEST)
    with pytest.raises(JobNotFound):
        store.get_job(job.id, tenant="t2")
    assert store.list_jobs(tenant="t2")[0] == []


def test_the_plan_made_at_acceptance_is_kept_with_the_job(store):
    plan = {"strategy": "ddp", "offload": "none", "gradient_checkpointing": False,
            "attention": "sdpa", "precision": "fp32", "predicted_memory_gb": 1.5}
    job = store.create_job(tenant="t1", request=REQUEST, plan=plan)
    assert store.get_job(job.id).plan == plan
    assert store.create_job(tenant="t1", request=REQUEST).plan is None


def test_cursor_pagination_newest_first(store):
    ids = [store.create_job(tenant="t", request=REQUEST).id for _ in range(5)]
    page1, more1 = store.list_jobs(tenant="t", limit=2)
    page2, more2 = store.list_jobs(tenant="t", limit=2, after=page1[-1].id)
    page3, more3 = store.list_jobs(tenant="t", limit=2, after=page2[-1].id)
    assert [j.id for j in page1 + page2 + page3] == ids[::-1]
    assert (more1, more2, more3) == (True, True, False)


def test_metrics_merge_reports_of_a_step_latest_winning(store):
    job = store.create_job(tenant="t", request=REQUEST)
    store.transition(job.id, JobStatus.queued, "validated")
    store.transition(job.id, JobStatus.running, "dispatched", attempt=1)
    store.record_metrics(job.id, 1, 1, {"loss": 3.0})
    store.record_metrics(job.id, 1, 2, {"loss": 2.0})
    store.transition(job.id, JobStatus.queued, "driver lost")
    store.transition(job.id, JobStatus.running, "dispatched", attempt=2)
    assert not store.record_metrics(job.id, 1, 3, {"loss": 9.0})  # attempt 1 is stale now
    store.record_metrics(job.id, 2, 2, {"loss": 2.5})  # attempt 2 re-ran step 2
    store.record_metrics(job.id, 2, 2, {"eval_loss": 1.0})  # and evaluated after it
    rows = store.list_metrics(job.id)
    assert [(m["step"], m["values"]["loss"]) for m in rows] == [(1, 3.0), (2, 2.5)]
    assert rows[1]["values"] == {"loss": 2.5, "eval_loss": 1.0}


def test_store_survives_restart_with_jobs_and_events(database_url):
    first = Store(database_url)
    job = first.create_job(tenant="t", request=REQUEST, name="keep me")
    first.transition(job.id, JobStatus.queued, "validated", data={"train_examples": 10})
    first.record_metrics(job.id, 0, 1, {"loss": 1.0})
    first.close()
    second = Store(database_url)  # a restarted service: new engine, schema already there
    again = second.get_job(job.id)
    assert (again.name, again.status, again.request) == ("keep me", JobStatus.queued, REQUEST)
    assert [e.type for e in second.list_events(job.id)[0]] == ["created", "queued"]
    assert second.list_metrics(job.id)[0]["values"] == {"loss": 1.0}
    second.close()


def test_metrics_page_by_step_reading_only_the_page(store):
    job = store.create_job(tenant="t", request=REQUEST)
    store.transition(job.id, JobStatus.queued, "validated")
    store.transition(job.id, JobStatus.running, "dispatched", attempt=1)
    for step in range(1, 8):
        store.record_metrics(job.id, 1, step, {"loss": 10.0 - step})
    store.record_metrics(job.id, 1, 3, {"eval_loss": 1.0})  # a later report of step 3
    first = store.list_metrics(job.id, limit=3)
    assert [m["step"] for m in first] == [1, 2, 3] and first[2]["values"] == {"loss": 7.0, "eval_loss": 1.0}
    assert [m["step"] for m in store.list_metrics(job.id, after_step=3, limit=3)] == [4, 5, 6]
    assert [m["step"] for m in store.list_metrics(job.id, after_step=6, limit=3)] == [7]
    assert store.list_metrics(job.id, after_step=7, limit=3) == []


def test_list_filters_on_metadata_in_the_database_and_pages_the_matches(store):
    def make(metadata):
        return store.create_job(tenant="t1", request={**REQUEST, **({"metadata": metadata} if metadata is not None else {})}).id

    plain, empty = make(None), make({})
    a1, b, a2 = make({"team": "a"}), make({"team": "b", "run": "2"}), make({"team": "a", "run": "it's \"3\""})
    store.create_job(tenant="t2", request={**REQUEST, "metadata": {"team": "a"}})  # another tenant's
    assert [j.id for j in store.list_jobs(tenant="t1", metadata_filter={"team": "a"})[0]] == [a2, a1]
    assert [j.id for j in store.list_jobs(tenant="t1", metadata_filter={"team": "b", "run": "2"})[0]] == [b]
    assert [j.id for j in store.list_jobs(tenant="t1", metadata_filter={"run": "it's \"3\""})[0]] == [a2]
    assert store.list_jobs(tenant="t1", metadata_filter={"team": "b", "run": "3"})[0] == []
    assert [j.id for j in store.list_jobs(tenant="t1", metadata_filter={})[0]] == [empty, plain]
    # Pages hold matches only: the cursor goes on from the last match.
    page, more = store.list_jobs(tenant="t1", metadata_filter={"team": "a"}, limit=1)
    assert [j.id for j in page] == [a2] and more
    page, more = store.list_jobs(tenant="t1", metadata_filter={"team": "a"}, limit=1, after=a2)
    assert [j.id for j in page] == [a1] and not more
