"""The scheduler with the cluster's capacity: the elastic policy over a real store (SQLite and
PostgreSQL), with the cluster's nodes given as Ray would report them. (The e2e tests run the same
code against a real multi-node Ray: tests/e2e/test_recovery.py.)

Run: .venv/bin/python -m pytest tests/integration/test_cluster_scheduling.py -q
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from eft.service.scheduling import queueing
from eft.service.scheduling.capacity import Node
from eft.service.scheduling.scheduler import Scheduler
from eft.service.settings import NodeGroup, Settings
from eft.service.store.store import Store
from eft.training.config import TrainConfig
from eft.types.jobs import JobStatus

from tests.helpers.fakes import RecordingLauncher

SPOT = "spot"


def validate_shape(job, settings):
    """The job's worker range and resources come from its request, as the real validator takes them."""
    shape = job.request.get("shape", {})
    cfg = TrainConfig(job_id=job.id, model_path="m", training_file="t", validation_file=None, method="lora",
                      lora=None, total_steps=100, num_train_examples=10,
                      min_workers=shape.get("min", 1), max_workers=shape.get("max", shape.get("min", 1)),
                      resources_per_worker=shape.get("resources", {}), use_gpu=shape.get("gpu", False))
    return cfg, {"train_examples": 10}


def spot_nodes(count: int, free: int | None = None) -> list[Node]:
    """`count` one-slot spot nodes, of which `free` are unused (all by default)."""
    free = count if free is None else free
    return [Node(id=f"n{i}", total={"CPU": 1.0, SPOT: 1.0},
                 available={"CPU": 1.0 if i < free else 0.0, SPOT: 1.0 if i < free else 0.0})
            for i in range(count)]


class Cluster:
    """The nodes the scheduler sees; each running job's workers take slots off them."""

    def __init__(self, store: Store, nodes: int):
        self.store, self.count = store, nodes

    def __call__(self) -> list[Node]:
        running = self.store.list_jobs(statuses=queueing.ACTIVE, limit=100)[0]
        used = sum(j.num_workers or int((j.config or {}).get("min_workers") or 1) for j in running)
        return spot_nodes(self.count, max(0, self.count - used))


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    yield s
    s.close()


def _job(store: Store, tenant: str = "t", priority: str | None = None, **shape) -> str:
    request = {"model": "tiny-llama", "training_file": "t.jsonl", "shape": {"resources": {SPOT: 1}, **shape}}
    if priority:
        request["priority"] = priority
    return store.create_job(tenant=tenant, request=request).id


def _scheduler(store: Store, nodes, **settings) -> tuple[Scheduler, RecordingLauncher]:
    launcher = RecordingLauncher()
    settings = Settings(**{"dispatch_grace_s": 3600, "max_running_jobs": 20, "max_running_jobs_per_tenant": 20,
                           "allowed_worker_resources": [SPOT], **settings})
    return Scheduler(store, launcher, settings, validate_shape, nodes=nodes), launcher


def _started(launcher: RecordingLauncher) -> set[str]:
    return {sid.rsplit("-attempt-", 1)[0] for sid in launcher.submitted}


def _run_at(store: Store, job_id: str, workers: int, step: int = 10, step_time_s: float = 1.0) -> None:
    """The job's driver reported `workers` workers and its step time (as it does at every step)."""
    job = store.get_job(job_id)
    store.update_job(job_id, attempt=job.attempt, num_workers=workers, step=step)
    store.record_metrics(job_id, job.attempt, step, {"step_time_s": step_time_s})


def test_two_tenants_with_equal_weights_get_half_the_slots_each(store):
    scheduler, launcher = _scheduler(store, Cluster(store, 4))
    a = [_job(store, "a") for _ in range(4)]
    b = [_job(store, "b") for _ in range(4)]
    scheduler.tick()
    started = _started(launcher)
    assert started == {a[0], a[1], b[0], b[1]}, started
    assert all(store.get_job(j).status is JobStatus.queued for j in (a[2], a[3], b[2], b[3]))
    # A finished job's slot goes to the tenant it came from (the other is at its share).
    store.transition(a[0], JobStatus.succeeded, "done")
    scheduler.tick()
    assert _started(launcher) - started == {a[2]}


def test_a_job_whose_minimum_cannot_be_placed_waits_with_a_reason_and_an_estimated_start(store):
    cluster = Cluster(store, 2)
    scheduler, launcher = _scheduler(store, cluster)
    first = _job(store)
    scheduler.tick()
    _run_at(store, first, 1, step=40, step_time_s=2.0)  # 60 steps left at 2 s: frees its slot in 120 s
    wide = _job(store, min=2)  # needs both slots: one is free
    never = _job(store, min=3)  # more than the cluster holds
    later = _job(store)  # fits in the free slot: starts past the wide one
    scheduler.tick()
    assert _started(launcher) == {first, later}
    # `later` holds the other slot now; the wide job needs both.
    _run_at(store, later, 1, step=90, step_time_s=1.0)  # 10 s left
    settings = scheduler.settings
    now = store.get_job(first).updated_at
    place = queueing.position(store, settings, store.get_job(wide), now, nodes=cluster())
    assert place.estimated_start is not None and "does not fit now: 0 of 2 slot(s)" in place.reason, place
    # Both running jobs must finish; the later finish is the first's.
    first_finish = store.get_job(first).updated_at + timedelta(seconds=120)
    assert abs((place.estimated_start - first_finish).total_seconds()) < 5
    place = queueing.position(store, settings, store.get_job(never), now, nodes=cluster())
    assert "more than the cluster can ever hold: 2 slot(s)" in place.reason and place.estimated_start is None
    assert store.get_job(wide).status is JobStatus.queued and store.get_job(never).status is JobStatus.queued


def test_the_autoscalers_maximum_admits_a_job_before_its_nodes_exist(store):
    groups = {"spot": NodeGroup(resources={SPOT: 1}, max_nodes=4, spot=True)}
    scheduler, launcher = _scheduler(store, Cluster(store, 1), node_groups=groups)
    wide = _job(store, min=3)
    scheduler.tick()
    assert _started(launcher) == {wide}  # Ray's autoscaler adds the nodes its workers wait for
    too_wide = _job(store, min=5)
    scheduler.tick()
    place = queueing.position(store, scheduler.settings, store.get_job(too_wide), nodes=scheduler.nodes())
    # The group's maximum counts the node it already has: 4 slots in all.
    assert "can ever hold: 4 slot(s)" in place.reason, place


def test_a_high_priority_job_shrinks_an_elastic_one_to_make_room_then_it_grows_back(store):
    scheduler, launcher = _scheduler(store, Cluster(store, 3))
    elastic = _job(store, min=1, max=3)
    scheduler.tick()
    assert store.get_job(elastic).schedule["workers"] == 3  # the whole idle cluster
    _run_at(store, elastic, 3)
    urgent = _job(store, "t", priority="high", min=2)
    scheduler.tick()
    job = store.get_job(elastic)
    # Shrunk to its minimum for the urgent job, which starts once the shrink has released the
    # slots (the elastic job's driver checkpoints, then restarts on one worker).
    assert job.schedule == {"workers": 1, "reason": "shrink: room for another job", "because_of": urgent,
                            "placement": {"cpu+spot": 1}}, job.schedule
    assert urgent not in _started(launcher)
    place = queueing.position(store, scheduler.settings, store.get_job(urgent), nodes=scheduler.nodes())
    assert place.reason.startswith(f"room is being made for it: {elastic} shrink"), place
    _run_at(store, elastic, 1)
    scheduler.tick()
    assert urgent in _started(launcher)
    events = [e for e in store.list_events(elastic, limit=100)[0] if e.type == "scheduled"]
    assert len(events) == 1 and urgent in events[-1].message and events[-1].data["workers"] == 1
    # The driver keeps to it: through the reporter it reads the scheduler's size.
    from eft.service.runs.reporter import StoreReporter

    limit = StoreReporter("", elastic, job.attempt, store=store).worker_limit()
    assert limit == {"workers": 1, "reason": "shrink: room for another job", "because_of": urgent}
    _run_at(store, urgent, 2)
    scheduler.tick()
    assert store.get_job(elastic).schedule["workers"] == 1  # nothing changed: no new event
    assert len([e for e in store.list_events(elastic, limit=100)[0] if e.type == "scheduled"]) == 1
    store.transition(urgent, JobStatus.succeeded, "done")
    scheduler.tick()
    assert store.get_job(elastic).schedule["workers"] == 3  # grows back into the freed room


def test_a_lower_priority_job_is_paused_for_a_minimum_that_cannot_fit_and_resumed_after(store):
    scheduler, launcher = _scheduler(store, Cluster(store, 2))
    low = _job(store, priority="low", min=2)
    scheduler.tick()
    _run_at(store, low, 2, step=30)
    urgent = _job(store, priority="high", min=2)
    scheduler.tick()
    job = store.get_job(low)
    assert job.status is JobStatus.pausing and job.schedule["paused"] and job.schedule["because_of"] == urgent
    assert store.get_job(urgent).status is JobStatus.queued  # until the low job's slots are free
    # The low job's workers checkpoint and stop (its driver reports it paused).
    store.transition(low, JobStatus.paused, "paused at step 30", step=30)
    scheduler.tick()
    assert store.get_job(urgent).status is JobStatus.running
    assert store.get_job(low).status is JobStatus.paused  # no room for it now
    # A user's pause is theirs: the scheduler never resumes it.
    mine = _job(store, priority="low")
    scheduler.tick()
    store.transition(mine, JobStatus.paused, "paused before it ran")
    store.transition(urgent, JobStatus.succeeded, "done")
    scheduler.tick()
    # Resumed by the scheduler and dispatched in the same pass: its second attempt resumes from
    # the pause checkpoint.
    assert store.get_job(low).status is JobStatus.running and store.get_job(low).attempt == 2
    resumed = [e for e in store.list_events(low, limit=100)[0] if e.type == "resume_requested"]
    assert [e.data["by"] for e in resumed] == ["scheduler"]
    assert store.get_job(mine).status is JobStatus.paused


def test_a_free_slot_goes_to_the_job_whose_measured_throughput_scales_best(store):
    """Goodput: both elastic jobs ran at 1 and 2 workers; one nearly doubled its tokens/s, the
    other gained 10%. With one slot free the first grows; the second stays at its size."""
    scheduler, launcher = _scheduler(store, Cluster(store, 3), resize_cost_s=0)
    poor = _job(store, min=1, max=2)
    good = _job(store, min=1, max=2)
    scheduler.tick()
    for job_id, rate_at_2 in ((poor, 110.0), (good, 195.0)):
        job = store.get_job(job_id)
        store.record_metrics(job_id, job.attempt, 1, {"tokens_per_s": 100.0, "world_size": 1.0, "step_time_s": 1.0})
        store.record_metrics(job_id, job.attempt, 2, {"tokens_per_s": rate_at_2, "world_size": 2.0, "step_time_s": 1.0})
        store.set_schedule(job_id, {"workers": 1})
    _run_at(store, poor, 1)
    _run_at(store, good, 1)
    scheduler.tick()
    assert store.get_job(good).schedule["workers"] == 2
    assert store.get_job(poor).schedule["workers"] == 1


def test_a_running_job_grows_only_when_the_time_saved_pays_for_the_resize(store):
    scheduler, _ = _scheduler(store, Cluster(store, 2), resize_cost_s=60)
    nearly_done = _job(store, min=1, max=2)
    scheduler.tick()
    store.set_schedule(nearly_done, {"workers": 1})
    _run_at(store, nearly_done, 1, step=95, step_time_s=1.0)  # 5 s left: a resize costs more
    scheduler.tick()
    job = store.get_job(nearly_done)
    assert job.schedule["workers"] == 1
    _run_at(store, nearly_done, 1, step=10, step_time_s=10.0)  # 900 s left: worth it
    scheduler.tick()
    assert store.get_job(nearly_done).schedule["workers"] == 2


def test_a_job_resizing_to_its_new_size_keeps_it_while_its_new_group_starts(store):
    """While an elastic job restarts on the size it was given, its new group already holds the
    slots (Ray shows none free) and the job still reports its old size: the scheduler must not
    read that as less room and take the size back (a resize loop)."""
    nodes = {"free": 2}
    scheduler, _ = _scheduler(store, lambda: spot_nodes(2, nodes["free"]), resize_cost_s=0)
    job_id = _job(store, min=1, max=2)
    scheduler.tick()
    store.set_schedule(job_id, {"workers": 1})
    _run_at(store, job_id, 1)
    nodes["free"] = 1
    scheduler.tick()
    assert store.get_job(job_id).schedule["workers"] == 2  # grows into the free slot
    nodes["free"] = 0  # the 2-worker group holds both slots; the job still reports 1 worker
    for _ in range(3):
        scheduler.tick()
        assert store.get_job(job_id).schedule["workers"] == 2
    grown = [e for e in store.list_events(job_id, limit=100)[0] if e.type == "scheduled"]
    assert [e.data["workers"] for e in grown] == [2]


def test_a_gpu_job_waits_for_a_gpu_type_with_its_planned_memory_and_is_pinned_to_the_one_it_starts_on(store):
    nodes = [Node(id="a10g", total={"CPU": 8.0, "GPU": 4.0, "accelerator_type:A10G": 1.0},
                  available={"CPU": 8.0, "GPU": 4.0, "accelerator_type:A10G": 1.0})]
    scheduler, launcher = _scheduler(store, lambda: list(nodes))

    def gpu_job(memory_gb: float) -> str:
        return store.create_job(tenant="t", request={"model": "m", "training_file": "t.jsonl", "shape": {"gpu": True}},
                                plan={"predicted_memory_gb": memory_gb}).id

    big, small = gpu_job(52.0), gpu_job(20.0)
    scheduler.tick()
    assert _started(launcher) == {small}
    assert store.get_job(small).schedule["accelerator_type"] == "A10G"
    place = queueing.position(store, scheduler.settings, store.get_job(big), nodes=nodes)
    assert "need 52.0 GB of GPU memory each" in place.reason and "A10G (24 GB)" in place.reason, place
    assert "EFT_GPU_MEMORY_BY_TYPE" in place.reason and store.get_job(big).status is JobStatus.queued
    # A node with larger GPUs joins: the big job starts there, pinned to it.
    nodes.append(Node(id="h100", total={"CPU": 8.0, "GPU": 8.0, "accelerator_type:H100": 1.0},
                      available={"CPU": 8.0, "GPU": 8.0, "accelerator_type:H100": 1.0}))
    scheduler.tick()
    assert _started(launcher) == {small, big}
    assert store.get_job(big).schedule["accelerator_type"] == "H100"
    # What its driver builds its Ray Train workers from (service/runs/entrypoint.py): the type pinned.
    from eft.service.runs.entrypoint import train_config

    assert train_config(store.get_job(big)).accelerator_type == "H100"
