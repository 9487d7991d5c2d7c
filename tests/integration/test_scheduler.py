"""The scheduler over a real store, with a small launcher and validator passed in (Ray's side is
covered by the e2e tests): limits, exactly-once claims, dispatch failures, reconciliation."""

import dataclasses
import threading

import pytest

from eft.types.jobs import JobStatus
from eft.service.runs.launcher import RayJobState
from eft.service.scheduling.scheduler import Scheduler
from eft.service.settings import Settings
from eft.service.store.store import Store
from tests.helpers.fakes import RecordingLauncher, unknown_capacity, validate_ok

REQUEST = {"model": "tiny-llama", "training_file": "t.jsonl"}


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    yield s
    s.close()


def _scheduler(store, launcher, **settings):
    # A Ray Job missing right after its claim counts as lost at once here (no submit is on its
    # way in these tests); the grace itself has its own test.
    return Scheduler(store, launcher, Settings(**{"dispatch_grace_s": 1e-6, **settings}), validate_ok,
                     nodes=unknown_capacity)


def _queued(store, tenant="t", n=1):
    jobs = [store.create_job(tenant=tenant, request=REQUEST) for _ in range(n)]
    return jobs


def test_validation_then_dispatch(store):
    launcher = RecordingLauncher()
    job, = _queued(store)
    _scheduler(store, launcher).tick()
    after = store.get_job(job.id)
    assert after.status is JobStatus.running and after.attempt == 1
    assert after.config["total_steps"] == 5 and after.total_steps == 5
    assert after.submission_id == launcher.submitted[0] == f"{job.id}-attempt-1"
    assert [e.type for e in store.list_events(job.id)[0]] == ["created", "queued", "dispatched", "submitted"]


def test_cluster_and_tenant_limits(store):
    launcher = RecordingLauncher()
    _queued(store, "a", 3)
    _queued(store, "b", 2)
    _scheduler(store, launcher, max_running_jobs=3, max_running_jobs_per_tenant=2).tick()
    running, _ = store.list_jobs(statuses=[JobStatus.running])
    assert len(running) == 3
    assert sorted(j.tenant for j in running) == ["a", "a", "b"]


def test_two_replicas_never_dispatch_one_job_twice(store):
    launcher = RecordingLauncher()
    jobs = _queued(store, "t", 6)
    first = _scheduler(store, launcher, max_running_jobs=100, max_running_jobs_per_tenant=100)
    first.validate_pending()
    replicas = [_scheduler(store, launcher, max_running_jobs=100, max_running_jobs_per_tenant=100)
                for _ in range(4)]
    threads = [threading.Thread(target=r.dispatch_queued) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(launcher.submitted) == sorted(f"{j.id}-attempt-1" for j in jobs)
    assert all(store.get_job(j.id).attempt == 1 for j in jobs)


def test_dispatch_failure_requeues_then_fails(store):
    launcher = RecordingLauncher(fail=True)
    job, = _queued(store)
    scheduler = _scheduler(store, launcher)
    for _ in range(3):
        scheduler.tick()
    failed = store.get_job(job.id)
    assert failed.status is JobStatus.failed and failed.attempt == 3
    assert failed.error_code == "platform_error.dispatch_failed"
    assert [e.type for e in store.list_events(job.id)[0]].count("dispatch_failed") == 2


def test_vanished_ray_job_is_dispatched_again_until_the_restart_budget_is_spent(store):
    launcher = RecordingLauncher()
    job, = _queued(store)
    scheduler = _scheduler(store, launcher)
    scheduler.tick()
    for attempt in (2, 3, 4):  # the config's max_restarts is 3
        launcher.states.clear()  # the head restarted and forgot the Ray Job
        scheduler.tick()  # reconcile: back to the queue
        assert store.get_job(job.id).status is JobStatus.queued
        scheduler.tick()  # dispatch the next attempt
        after = store.get_job(job.id)
        assert after.status is JobStatus.running and after.attempt == attempt
        assert after.restarts == attempt - 1
    launcher.states.clear()
    scheduler.tick()
    failed = store.get_job(job.id)
    assert failed.status is JobStatus.failed and failed.restarts == 3
    assert failed.error_code == "platform_error.driver_exited" and "driver log tail" in failed.error_message
    assert launcher.submitted == [f"{job.id}-attempt-{n}" for n in (1, 2, 3, 4)]
    restarted = [e for e in store.list_events(job.id)[0] if e.type == "restarted"]
    assert [e.data["attempt"] for e in restarted] == [1, 2, 3]
    assert all(e.data["reason"] == "driver_lost" for e in restarted)


def test_restart_budget_comes_from_the_job(store):
    launcher = RecordingLauncher()
    job, = _queued(store)

    def validate_no_restarts(job, settings):
        cfg, stats = validate_ok(job, settings)
        return dataclasses.replace(cfg, max_restarts=0), stats

    scheduler = Scheduler(store, launcher, Settings(dispatch_grace_s=1e-6), validate_no_restarts, nodes=unknown_capacity)
    scheduler.tick()
    launcher.states.clear()
    scheduler.tick()
    assert store.get_job(job.id).status is JobStatus.failed
    assert launcher.submitted == [f"{job.id}-attempt-1"]


def test_cancelling_job_is_stopped_and_settled(store):
    launcher = RecordingLauncher()
    job, = _queued(store)
    scheduler = _scheduler(store, launcher)
    scheduler.tick()
    store.transition(job.id, JobStatus.cancelling, "cancel requested")
    scheduler.tick()
    assert launcher.stopped == [f"{job.id}-attempt-1"]
    assert store.get_job(job.id).status is JobStatus.cancelled


def test_user_error_in_validation_fails_without_dispatch(store):
    from eft.training.errors import TrainingUserError

    def validate_bad(job, settings):
        raise TrainingUserError("user_error.invalid_data", "t.jsonl line 3: record: too long", "training_file")

    launcher = RecordingLauncher()
    job, = _queued(store)
    Scheduler(store, launcher, Settings(), validate_bad, nodes=unknown_capacity).tick()
    failed = store.get_job(job.id)
    assert (failed.status, failed.error_code, failed.error_param) == (
        JobStatus.failed, "user_error.invalid_data", "training_file")
    assert launcher.submitted == []


def test_paused_dispatch_validates_and_queues_but_starts_nothing(store):
    launcher = RecordingLauncher()
    job, = _queued(store)
    _scheduler(store, launcher, dispatch_paused=True).tick()
    assert store.get_job(job.id).status is JobStatus.queued and launcher.submitted == []
    _scheduler(store, launcher).tick()  # resumed
    assert store.get_job(job.id).status is JobStatus.running and len(launcher.submitted) == 1


def test_a_pass_without_reconcile_asks_ray_only_about_cancelling_jobs(store):
    launcher = RecordingLauncher()
    running, cancelling = _queued(store, n=2)
    scheduler = _scheduler(store, launcher)
    scheduler.tick()
    store.transition(cancelling.id, JobStatus.cancelling, "cancel requested")
    asked: list[str] = []
    state = launcher.state
    launcher.state = lambda sid: asked.append(sid) or state(sid)
    launcher.states[store.get_job(running.id).submission_id] = RayJobState.FAILED  # its driver died
    scheduler.tick(reconcile=False)
    assert asked == [store.get_job(cancelling.id).submission_id]
    assert store.get_job(cancelling.id).status is JobStatus.cancelled
    assert store.get_job(running.id).status is JobStatus.running  # not looked at yet
    scheduler.tick()
    assert store.get_job(running.id).status is JobStatus.queued  # requeued to resume


def test_a_created_job_wakes_the_scheduler_before_its_interval(store):
    from eft.service.jobs.manager import JobService

    launcher = RecordingLauncher()
    scheduler = _scheduler(store, launcher, scheduler_interval_s=3600, reconcile_interval_s=3600)
    passes = threading.Semaphore(0)
    tick = scheduler.tick
    scheduler.tick = lambda reconcile=True: (tick(reconcile), passes.release())
    thread = threading.Thread(target=scheduler.run_forever, daemon=True)
    thread.start()
    try:
        assert passes.acquire(timeout=30)  # the first pass runs at start
        job, = _queued(store)
        JobService(store, launcher, Settings(), on_created=scheduler.wake).on_created()
        assert passes.acquire(timeout=30), "no pass after wake() with an hour-long interval"
        assert store.get_job(job.id).status is JobStatus.running
    finally:
        scheduler.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_cancel_that_races_the_scheduler_cancels_the_job_it_finds(store):
    """The scheduler validates the job between the cancel's read and its compare-and-set: the
    cancel reads the job again and cancels it from `queued` (it answered 409 before)."""
    from eft.service.jobs.manager import JobService

    launcher = RecordingLauncher()
    job, = _queued(store)
    scheduler = _scheduler(store, launcher, dispatch_paused=True)
    get_job, reads = store.get_job, []

    def read_then_race(*args, **kwargs):
        record = get_job(*args, **kwargs)
        reads.append(record.status)
        if len(reads) == 2:  # the transition's own read: the scheduler moves the job after it
            scheduler.validate_pending()
        return record

    store.get_job = read_then_race
    cancelled = JobService(store, launcher, Settings()).cancel(job.id, "t")
    assert reads[:2] == [JobStatus.validating, JobStatus.validating]
    assert cancelled.status == JobStatus.cancelled
    types = [e.type for e in store.list_events(job.id)[0]]
    assert types == ["created", "queued", "cancelled"], types


def test_a_slow_validation_never_requeues_a_job_another_replica_dispatched(store):
    """Replica B validates a job while replica A validates and dispatches it (B's first job
    imports for seconds): B's late `queued` must not move the running job back to the queue,
    which would dispatch it a second time."""
    launcher = RecordingLauncher()
    job, = _queued(store)
    first = _scheduler(store, launcher)

    def validate_slowly(job, settings):
        first.tick()  # A: validating -> queued -> running, attempt 1, submitted
        return validate_ok(job, settings)

    second = Scheduler(store, launcher, Settings(), validate_slowly, nodes=unknown_capacity)
    second.tick()
    after = store.get_job(job.id)
    assert after.status is JobStatus.running and after.attempt == 1
    assert launcher.submitted == [f"{job.id}-attempt-1"]
    types = [e.type for e in store.list_events(job.id)[0]]
    assert types == ["created", "queued", "dispatched", "submitted"], types


def test_four_replicas_at_once_never_pass_the_cluster_limit(store):
    """The limits are checked in the claim's serialized transaction: four replicas, each with
    its own connection pool, dispatching the same queue at once start exactly 2 of 8 jobs."""
    launcher = RecordingLauncher()
    _queued(store, "a", 4)
    _queued(store, "b", 4)
    _scheduler(store, launcher).validate_pending()
    stores = [Store(store.url, migrate=False) for _ in range(4)]
    replicas = [_scheduler(s, launcher, max_running_jobs=2, max_running_jobs_per_tenant=10) for s in stores]
    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=lambda r=r: (barrier.wait(), r.dispatch_queued())) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert len(store.list_jobs(statuses=[JobStatus.running])[0]) == 2
    assert len(launcher.submitted) == 2


def test_another_tenants_job_is_dispatched_past_a_backlog_of_500(store):
    """Tenant a queued 500 jobs before tenant b queued one; a runs its 2 and b's job takes the
    next free slot (dispatch looks at every tenant's oldest job, not at a window of the queue)."""
    from eft.service.store.schema import jobs as jobs_table
    from eft.service.store.store import utcnow

    now = utcnow()
    with store.engine.begin() as conn:  # 500 queued jobs of one tenant, in one statement
        conn.execute(jobs_table.insert(), [
            dict(id=f"ftjob-000000000000{i:08x}", tenant="a", status="queued", request=REQUEST, attempt=0,
                 step=0, created_at=now, updated_at=now, config={"max_restarts": 3})
            for i in range(500)])
    late, = _queued(store, "b")
    launcher = RecordingLauncher()
    _scheduler(store, launcher, max_running_jobs=10, max_running_jobs_per_tenant=2).tick()
    assert store.get_job(late.id).status is JobStatus.running
    assert store.active_by_tenant([JobStatus.running]) == {"a": 2, "b": 1}


def test_tenants_take_turns_for_the_free_slots(store):
    """Slots are shared one job per tenant per round, longest-waiting tenant first."""
    first = _queued(store, "a", 5)
    second = _queued(store, "b", 5)
    launcher = RecordingLauncher()
    _scheduler(store, launcher, max_running_jobs=4, max_running_jobs_per_tenant=4).tick()
    assert launcher.submitted == [f"{j.id}-attempt-1" for j in (first[0], second[0], first[1], second[1])]


def test_a_claimed_job_without_its_ray_job_waits_out_the_grace_then_is_queued_again(store):
    launcher = RecordingLauncher()
    job, = _queued(store)
    patient = _scheduler(store, launcher, dispatch_grace_s=3600)
    patient.tick()
    launcher.states.clear()  # the submit has not reached Ray yet (or Ray lost it)
    patient.tick()
    assert store.get_job(job.id).status is JobStatus.running  # within the grace: left alone
    impatient = _scheduler(store, launcher)
    impatient.tick()  # past the grace: lost, queued again within its restart budget
    assert store.get_job(job.id).status is JobStatus.queued and store.get_job(job.id).restarts == 1
    impatient.tick()
    assert store.get_job(job.id).status is JobStatus.running and store.get_job(job.id).attempt == 2


class Crash(BaseException):
    """The replica's process dies here (not an error any handler of the replica catches)."""


def _finish_as_driver(store, job_id):
    """Play the driver of the job's current attempt: it succeeds, and its Ray Job ends."""
    from eft.service.runs.reporter import StoreReporter

    job = store.get_job(job_id)
    assert StoreReporter(store.url, job_id, job.attempt).succeeded("/artifacts/x", {"loss": 1.0}, 5)
    return job.submission_id


@pytest.mark.parametrize("where", ["before_claim", "after_claim", "after_submit", "before_recording",
                                   "claim_commit_lost"])
def test_a_replica_crashing_at_any_step_of_dispatch_leaves_the_job_run_exactly_once(store, where):
    """Replica A dies at `where`; replica B (a new process: new store, same database and Ray)
    takes over. The job runs once to success, every Ray Job but the one that finished it is
    stopped, and its events tell the whole story."""
    launcher = RecordingLauncher()
    job, = _queued(store)
    a_store = Store(store.url, migrate=False)
    a = _scheduler(a_store, launcher)
    a.validate_pending()
    if where == "before_claim":
        a_store.claim = lambda *args, **kw: (_ for _ in ()).throw(Crash())
    elif where == "after_claim":
        claim = a_store.claim
        a_store.claim = lambda *args, **kw: (claim(*args, **kw), (_ for _ in ()).throw(Crash()))
    elif where == "after_submit":
        submit = launcher.submit
        launcher.submit = lambda *args: (submit(*args), (_ for _ in ()).throw(Crash()))
    elif where == "before_recording":
        a_store.append_event = lambda *args, **kw: (_ for _ in ()).throw(Crash())
    else:  # the claim committed but its connection dropped; the retried claim then misses
        claim = a_store.claim
        a_store.claim = lambda *args, **kw: (claim(*args, **kw), None)[1]
    try:
        a.dispatch_queued()
    except Crash:
        pass
    a_store.close()
    launcher.submit = RecordingLauncher.submit.__get__(launcher)

    b = _scheduler(store, launcher)
    for _ in range(4):  # reconcile settles what A left; dispatch starts what must run
        b.tick()
        if store.get_job(job.id).status is JobStatus.running and launcher.state(
                store.get_job(job.id).submission_id) == RayJobState.RUNNING:
            break
    winner = _finish_as_driver(store, job.id)
    launcher.states[winner] = RayJobState.SUCCEEDED
    b.tick()
    done = store.get_job(job.id)
    assert done.status is JobStatus.succeeded
    types = [e.type for e in store.list_events(job.id)[0]]
    assert types.count("succeeded") == 1 and types.count("dispatched") >= 1
    assert types[:3] == ["created", "queued", "dispatched"], types
    # Nothing of the job still runs on Ray: every other attempt's Ray Job was stopped.
    assert [sid for sid, state in launcher.states.items() if state == RayJobState.RUNNING] == []
    assert set(launcher.submitted) - {winner} <= set(launcher.stopped)
    if where != "before_claim" and where != "claim_commit_lost":
        assert done.attempt == (2 if where == "after_claim" else 1), types
    else:
        assert done.attempt == 1 and launcher.submitted == [winner], types


def test_a_cancel_during_a_failed_submit_ends_cancelled(store):
    """The cancel lands while the submit is failing: the dispatcher cannot requeue a job that
    is `cancelling` now, and reconcile settles it as cancelled (before, it stayed `cancelling`
    for ever because no submission id had been recorded)."""
    from eft.service.jobs.manager import JobService

    launcher = RecordingLauncher()
    job, = _queued(store)
    scheduler = _scheduler(store, launcher)
    scheduler.validate_pending()

    def cancel_then_fail(job_id, attempt, name):
        JobService(store, launcher, Settings()).cancel(job_id, "t")
        raise ConnectionError("dashboard unreachable")

    launcher.submit = cancel_then_fail
    scheduler.dispatch_queued()
    assert store.get_job(job.id).status is JobStatus.cancelling
    scheduler.tick()
    assert store.get_job(job.id).status is JobStatus.cancelled
    assert f"{job.id}-attempt-1" in launcher.stopped


def test_a_replica_crashing_in_the_middle_of_a_cancel_leaves_nothing_running(store):
    """The cancel recorded `cancelling` and the replica died before it stopped the Ray Job:
    the next replica's pass stops it and settles the job as cancelled, once."""
    from eft.service.jobs.manager import JobService

    launcher = RecordingLauncher()
    job, = _queued(store)
    _scheduler(store, launcher).tick()
    sid = store.get_job(job.id).submission_id
    stop = launcher.stop
    launcher.stop = lambda submission_id: (_ for _ in ()).throw(Crash())
    with pytest.raises(Crash):
        JobService(store, launcher, Settings()).cancel(job.id, "t")
    assert store.get_job(job.id).status is JobStatus.cancelling
    assert launcher.state(sid) == RayJobState.RUNNING  # still running: nobody stopped it
    launcher.stop = stop
    _scheduler(Store(store.url, migrate=False), launcher).tick(reconcile=False)  # cancelling: every pass
    assert launcher.stopped == [sid] and launcher.state(sid) == RayJobState.STOPPED
    done = store.get_job(job.id)
    assert done.status is JobStatus.cancelled
    assert [e.type for e in store.list_events(job.id)[0]].count("cancelled") == 1


def test_the_sqlite_store_is_readable_by_its_owner_only(tmp_path):
    import stat

    store = Store(f"sqlite:///{tmp_path / 'eft.db'}")
    store.create_job(tenant="t", request=REQUEST)  # the write-ahead log exists while open
    files = [tmp_path / name for name in ("eft.db", "eft.db-wal", "eft.db-shm") if (tmp_path / name).exists()]
    assert tmp_path / "eft.db" in files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    store.close()


def test_priority_orders_a_tenants_queue_and_weights_share_the_slots(store):
    """Within a tenant the high-priority job starts first; across tenants the slots go by the
    tenants' weights (EFT_TENANT_SHARES), whatever the jobs' priorities."""
    from eft.service.settings import TenantShare

    low = store.create_job(tenant="a", request={**REQUEST, "priority": "low"})
    a_jobs = _queued(store, "a", 3)
    urgent = store.create_job(tenant="a", request={**REQUEST, "priority": 90})
    b_jobs = [store.create_job(tenant="b", request={**REQUEST, "priority": "high"}) for _ in range(3)]
    launcher = RecordingLauncher()
    scheduler = _scheduler(store, launcher, max_running_jobs=3, max_running_jobs_per_tenant=3,
                           tenant_shares={"a": TenantShare(weight=2)})
    scheduler.tick()
    started = {sid.rsplit("-attempt-", 1)[0] for sid in launcher.submitted}
    # a weighs 2: two of the three slots, its priority-90 job and then its oldest normal one;
    # b's high priority does not take a's share.
    assert started == {urgent.id, a_jobs[0].id, b_jobs[0].id}
    assert store.get_job(low.id).status is JobStatus.queued


def test_a_queued_job_reports_its_place_its_reason_and_an_estimated_start(store):
    from datetime import timedelta

    from eft.service.scheduling import queueing
    settings = Settings(max_running_jobs=1, max_running_jobs_per_tenant=1)
    running, = _queued(store, "a")
    store.transition(running.id, JobStatus.queued, "validated", total_steps=100)
    store.transition(running.id, JobStatus.running, "go", attempt=1)
    store.update_job(running.id, attempt=1, step=50)
    store.record_metrics(running.id, 1, 50, {"step_time_s": 2.0})
    waiting = [store.create_job(tenant=t, request=REQUEST) for t in ("a", "b", "b")]
    for job in waiting:
        store.transition(job.id, JobStatus.queued, "validated")
    now = store.get_job(running.id).updated_at
    places = {j.id: queueing.position(store, settings, store.get_job(j.id), now) for j in waiting}
    # b runs nothing, a runs one: b's first job goes first; then both tenants are at their
    # limit of one and the longer-waiting tenant's job (a's) comes next.
    assert [places[j.id].position for j in waiting] == [2, 1, 3]
    assert "a slot" not in places[waiting[1].id].reason and "limit" in places[waiting[1].id].reason
    assert "its tenant runs 1 jobs" in places[waiting[0].id].reason
    # The next slot frees when the running job's 50 remaining steps of 2 s are done.
    assert places[waiting[1].id].estimated_start == now + timedelta(seconds=100)
    assert places[waiting[0].id].estimated_start is None  # no second running job to finish
    assert queueing.position(store, settings, store.get_job(running.id)) is None


def test_reads_share_the_queue_order_until_the_queue_changes(store):
    """`GET /jobs/{id}` of queued jobs shares one dispatch order (service/scheduling/queueing.py
    `QueueCache`): reads between two changes get the places a fresh computation gives, a job
    queued, dispatched or started elsewhere changes them at once, and the plan `take` uses is
    never changed by a read."""
    from eft.service.scheduling import queueing
    settings = Settings(max_running_jobs=1, max_running_jobs_per_tenant=5)
    cache = queueing.QueueCache(store, settings, max_age_s=3600)  # only a change may refresh it
    jobs = _queued(store, "a", 3)
    for job in jobs:
        store.transition(job.id, JobStatus.queued, "validated")

    def places(cached: bool) -> list[int]:
        return [queueing.position(store, settings, store.get_job(j.id), cache=cache if cached else None).position
                for j in jobs if store.get_job(j.id).status is JobStatus.queued]

    assert places(True) == places(False) == [1, 2, 3]
    version, line = cache.line()
    assert cache.line()[1] is line  # unchanged queue: the same order object, not computed again
    # Another tenant's job joins: the fair order gives tenant b the second place at once.
    other = store.create_job(tenant="b", request=REQUEST)
    store.transition(other.id, JobStatus.queued, "validated")
    assert cache.line()[0] != version
    assert queueing.position(store, settings, store.get_job(other.id), cache=cache).position == 2
    assert places(True) == places(False) == [1, 3, 4]
    # a's first job starts: a runs one, b none, so b's job goes first now.
    store.transition(jobs[0].id, JobStatus.running, "go", attempt=1)
    moved = cache.line()[0]
    store.update_job(jobs[0].id, attempt=1, step=5)  # a running job's progress keeps the order
    assert cache.line()[0] == moved
    assert queueing.position(store, settings, store.get_job(other.id), cache=cache).position == 1
    assert places(True) == places(False) == [2, 3]
    assert "1 jobs run, the cluster's limit" in queueing.position(
        store, settings, store.get_job(jobs[1].id), cache=cache).reason
