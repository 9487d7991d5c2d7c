"""The dispatch order of queued jobs, and each queued job's place in it.

Job slots (`EFT_MAX_RUNNING_JOBS`, `EFT_MAX_RUNNING_JOBS_PER_TENANT`) are shared between tenants
by weighted fair queueing (`eft.service.scheduling.policy.fair_order`, weights and guaranteed jobs from
`EFT_TENANT_SHARES`): the next free slot goes to the tenant furthest below its share, and within
a tenant to its highest-priority, then oldest, job. The scheduler dispatches in this order; a
queued job's `queue` field reports its place, why it waits, and when a slot should free up (the
running jobs' estimated finishes).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable

from eft.service.scheduling import capacity
from eft.service.scheduling.capacity import Node, Picture, Shape
from eft.service.scheduling.policy import Decision, Demand, Tenant, fair_order, plan, priority_value, speedup_curve
from eft.service.jobs.progress import progress_fields
from eft.service.settings import Settings
from eft.service.store.store import JobRecord, Store, utcnow
from eft.types.jobs import JobStatus, QueuePosition
from eft.types.text import decimal_int

ACTIVE = (JobStatus.running, JobStatus.pausing, JobStatus.cancelling)


def _priority(raw: Any) -> int:
    try:
        number = decimal_int(raw)
        return priority_value(raw if number is None else number)
    except (KeyError, ValueError):
        return priority_value(None)


@dataclass
class Queue:
    order: list[str]  # queued job ids, the next to dispatch first
    tenant_of: dict[str, str]
    running: Counter[str]  # active jobs per tenant


def tenants(settings: Settings) -> dict[str, Tenant]:
    return {t: Tenant(weight=s.weight, guaranteed=s.guaranteed) for t, s in settings.tenant_shares.items()}


def queue(store: Store, settings: Settings) -> Queue:
    """The queued jobs in dispatch order."""
    lines = store.queue_lines()
    running = store.active_by_tenant(ACTIVE)
    demands = [Demand(id=job_id, tenant=tenant, min_workers=1, max_workers=1, arrival=i, priority=_priority(raw))
               for i, (job_id, tenant, raw) in enumerate(lines)]
    order = fair_order(running, demands, tenants(settings), settings.max_running_jobs_per_tenant)
    return Queue([d.id for d in order], {job_id: tenant for job_id, tenant, _ in lines}, running)


@dataclass
class ClusterPlan:
    """The policy's decision for every queued, running and scheduler-paused job, on the pools
    Ray's nodes make up now."""

    picture: Picture
    shapes: dict[str, Shape]
    jobs: dict[str, JobRecord]
    decisions: dict[str, Decision]
    held: dict[str, int]  # slots the service's active jobs hold, per pool
    holding: dict[str, int]  # workers each active job holds (or is resizing to)
    #: Slots a job may start on now, per pool: free in Ray and claimed by no active job (one
    #: shrinking for it still holds its slots), plus what the autoscaler may still add.
    free: dict[str, int]

    def take(self, job_id: str) -> bool:
        """Whether the job's minimum can be placed now; if so, its slots are taken from `free`."""
        shape = self.shapes[job_id]
        names = sorted(self.picture.pools_for(shape), key=lambda p: (self.picture.pools[p].spot, p))
        if sum(self.free.get(p, 0) for p in names) < shape.min_workers:
            return False
        left = shape.min_workers
        for name in names:
            take = min(left, self.free.get(name, 0))
            self.free[name] -= take
            left -= take
        return True


def _remaining_s(job: JobRecord, latest: dict[str, Any] | None, curve: tuple[float, ...] | None) -> float | None:
    """The work a running job has left, in seconds at one worker: its remaining steps at its
    last step time, times its current size's speedup. None when unknown (growth always pays)."""
    step_time = (latest or {}).get("step_time_s")
    workers = int((latest or {}).get("world_size") or job.num_workers or 0)
    if not step_time or not job.total_steps or workers < 1:
        return None
    speedup = curve[min(workers, len(curve)) - 1] if curve else float(workers)
    return max(0, job.total_steps - job.step) * float(step_time) * speedup


def scheduler_paused(job: JobRecord) -> bool:
    return job.status is JobStatus.paused and bool((job.schedule or {}).get("paused"))


def cluster_plan(store: Store, settings: Settings, nodes: list[Node] | None) -> ClusterPlan | None:
    """What the elastic policy (`eft.service.scheduling.policy.plan`) decides now; None when capacity is
    unknown (`nodes` None) or `EFT_SCHEDULING=count`."""
    if nodes is None or settings.scheduling != "elastic":
        return None
    limit = 10_000
    queued = store.list_jobs(statuses=[JobStatus.queued], oldest_first=True, limit=limit)[0]
    active = store.list_jobs(statuses=ACTIVE, oldest_first=True, limit=limit)[0]
    paused = [j for j in store.list_jobs(statuses=[JobStatus.paused], oldest_first=True, limit=limit)[0]
              if scheduler_paused(j)]
    shapes = {j.id: capacity.shape_of(j.config, j.plan, j.schedule if j.status in ACTIVE else None)
              for j in (*queued, *active, *paused)}
    # A running job holds what it last reported (its minimum until its workers are up), or the
    # size it was given while it resizes to it: its new group holds those slots before it reports.
    holding = {j.id: max(shapes[j.id].min_workers, j.num_workers or 0, int((j.schedule or {}).get("workers") or 0))
               for j in active}
    first = capacity.pools(nodes, settings)
    held = capacity.place_held(first, [(shapes[j.id], holding[j.id]) for j in active])
    picture = capacity.pools(nodes, settings, held)
    # Jobs on their way out (pausing, cancelling) keep their slots until they are gone: the
    # policy plans the rest of the cluster.
    leaving = capacity.place_held(picture, [(shapes[j.id], holding[j.id]) for j in active
                                            if j.status is not JobStatus.running])
    pools = [capacity.Pool(p.name, max(0, p.slots - leaving.get(p.name, 0)), p.spot, p.max_slots)
             for p in picture.pools.values()]
    planned = {p.name: p for p in pools}
    # Goodput: how each running elastic job's throughput scales (measured at the sizes it has
    # run at) and the work it has left, for the policy's growth decisions.
    elastic = [j for j in active if j.status is JobStatus.running and shapes[j.id].max_workers > shapes[j.id].min_workers]
    measured = store.throughput_by_size(j.id for j in elastic)
    latest = store.latest_metric_values(j.id for j in elastic)
    demands = []
    for order, job in enumerate(sorted((*queued, *active, *paused), key=lambda j: j.id)):
        if job.status in ACTIVE and job.status is not JobStatus.running:
            continue
        shape = shapes[job.id]
        if shape.min_workers > picture.ceiling(picture.pools_for(shape)):
            continue  # can never be placed here: stays queued, its reason says why
        curve = speedup_curve(measured.get(job.id, {}), shape.max_workers) if settings.scheduler_goodput else None
        demands.append(capacity.demand(
            job.id, job.tenant, shape, picture, arrival=order, priority=_priority((job.request or {}).get("priority")),
            workers=holding.get(job.id, 0), speedup=curve,
            remaining_s=_remaining_s(job, latest.get(job.id), curve)))
    # Admission counts what the autoscaler can add: a group below its maximum grows for the
    # workers that wait on it.
    ceilings = [capacity.Pool(p.name, p.ceiling, p.spot) for p in planned.values()]
    decisions = plan(ceilings, demands, tenants(settings), policy="elastic", resize_cost_s=settings.resize_cost_s)
    jobs = {j.id: j for j in (*queued, *active, *paused)}
    # Free to start on: free in Ray and claimed by no active job (`held` counts a growing job at
    # the size it was given, a starting one at its minimum), plus what the autoscaler may add.
    free = {name: max(0, min(picture.free_now.get(name, 0), picture.total.get(name, 0) - held.get(name, 0)))
            + max(0, (pool.max_slots or 0) - picture.total.get(name, 0)) for name, pool in picture.pools.items()}
    return ClusterPlan(picture, shapes, jobs, decisions, held, holding, free)


def waiting_reason(cluster: ClusterPlan, job_id: str) -> tuple[str, int, int]:
    """Why the policy keeps a queued job waiting: (reason, slots it needs, slots free for it)."""
    shape = cluster.shapes[job_id]
    names = sorted(cluster.picture.pools_for(shape))
    ceiling = cluster.picture.ceiling(names)
    free = sum(max(0, cluster.picture.pools[p].ceiling - cluster.held.get(p, 0)) for p in names)
    if not names:
        small = sorted(p for p in cluster.picture.kinds
                       if cluster.picture.kind_fits(shape, p) and not cluster.picture.memory_fits(shape, p))
        if small:
            have = ", ".join(f"{cluster.picture.gpu_types[p]} ({cluster.picture.gpu_memory[p]:g} GB)" for p in small)
            return (f"its workers need {shape.memory_gb:.1f} GB of GPU memory each (the planner's prediction for "
                    f"its configuration), more than this cluster's GPUs have: {have}; it starts once nodes with "
                    "larger GPUs join (add them, or a group with their gpu_type to EFT_NODE_GROUPS; if a GPU type "
                    "has more memory than assumed, say so in EFT_GPU_MEMORY_BY_TYPE)", shape.min_workers, 0)
        return (f"no node of this cluster can hold one of its workers ({shape.describe()}); it starts once "
                "nodes with those resources join (add them, or a group to EFT_NODE_GROUPS)", shape.min_workers, 0)
    where = ", ".join(names)
    if shape.min_workers > ceiling:
        return (f"its minimum, {shape.describe()}, is more than the cluster can ever hold: {ceiling} slot(s) "
                f"in {where}, the autoscaler's maximum included; it starts once the cluster grows",
                shape.min_workers, free)
    decision = cluster.decisions.get(job_id)
    why = f" ({decision.reason})" if decision is not None else ""
    return (f"its minimum, {shape.describe()}, does not fit now: {free} of {ceiling} slot(s) in {where} are "
            f"free{why}", shape.min_workers, free)


class QueueCache:
    """The dispatch order and the cluster plan behind queued jobs' places, kept between reads.

    Without it every `GET /jobs/{id}` of a queued job orders all queued jobs again (and plans
    the cluster, asking Ray for its nodes): at a few hundred queued jobs that costs several
    times the rest of the read, and the reads of a busy service queue up behind it. The order
    is computed again when the store's `queue_version` (one aggregate query per read) changed
    and at least every `max_age_s`; the cluster plan, an estimate anyway (running jobs move on
    between reads), at most once per `max_age_s` (the scheduler's interval by default)."""

    def __init__(self, store: Store, settings: Settings, max_age_s: float | None = None):
        self.store, self.settings = store, settings
        self.max_age_s = settings.scheduler_interval_s if max_age_s is None else max_age_s
        self._lock = threading.Lock()  # one read computes, the ones beside it wait and reuse it
        self._line: tuple[Any, float, Queue] | None = None
        self._cluster: tuple[Any, float, ClusterPlan | None] | None = None

    def _fresh(self, kept: tuple[Any, float, Any] | None, version: Any, now: float) -> bool:
        return kept is not None and kept[0] == version and now - kept[1] <= self.max_age_s

    def line(self) -> tuple[Any, Queue]:
        version = self.store.queue_version(ACTIVE)
        with self._lock:
            now = time.monotonic()
            if not self._fresh(self._line, version, now):
                self._line = (version, now, queue(self.store, self.settings))
            return version, self._line[2]

    def cluster(self, version: Any, nodes: Callable[[], list[Node] | None]) -> ClusterPlan | None:
        with self._lock:
            now = time.monotonic()
            if not self._fresh(self._cluster, version, now):
                self._cluster = (version, now, cluster_plan(self.store, self.settings, nodes()))
            return self._cluster[2]


def position(store: Store, settings: Settings, job: JobRecord, now: datetime | None = None,
             nodes: list[Node] | None = None, cache: QueueCache | None = None) -> QueuePosition | None:
    """A queued job's place in line, why it waits, and when a slot should free up for it;
    with `cache`, from the order and plan it keeps."""
    if job.status is not JobStatus.queued:
        return None
    now = now or utcnow()
    version, line = cache.line() if cache is not None else (None, queue(store, settings))
    if job.id not in line.order:
        return None
    place = line.order.index(job.id)
    running = sum(line.running.values())
    free = max(0, settings.max_running_jobs - running)
    if settings.dispatch_paused:
        reason = "dispatching is paused on this service (EFT_DISPATCH_PAUSED)"
    elif line.running[job.tenant] >= settings.max_running_jobs_per_tenant:
        reason = (f"its tenant runs {line.running[job.tenant]} jobs, its limit "
                  f"(EFT_MAX_RUNNING_JOBS_PER_TENANT={settings.max_running_jobs_per_tenant})")
    elif place < free:
        reason = "a slot is free: it starts on the scheduler's next pass"
    else:
        reason = (f"{running} jobs run, the cluster's limit (EFT_MAX_RUNNING_JOBS={settings.max_running_jobs}); "
                  f"{place} queued jobs go before it")
    estimated = None
    cluster = None
    if not settings.dispatch_paused and line.running[job.tenant] < settings.max_running_jobs_per_tenant:
        def cluster_nodes() -> list[Node] | None:
            return nodes if nodes is not None else capacity.snapshot(settings)

        cluster = (cache.cluster(version, cluster_nodes) if cache is not None
                   else cluster_plan(store, settings, cluster_nodes()))
        if cluster is not None:  # `take` below must leave a shared plan as it was
            cluster = replace(cluster, free=dict(cluster.free))
    decision = cluster.decisions.get(job.id) if cluster is not None else None
    if cluster is not None and (decision is None or not decision.runs):
        reason, need, room = waiting_reason(cluster, job.id)
        return QueuePosition(position=place + 1, reason=reason,
                             estimated_start=_slots_free_at(store, cluster, job.id, need - room, now))
    if cluster is not None and place < free and not cluster.take(job.id):
        making = sorted(j for j, d in cluster.decisions.items() if d.because_of == job.id)
        return QueuePosition(position=place + 1, reason="room is being made for it: "
                             + (", ".join(making) + " shrink(s) or pause(s) through a checkpoint first"
                                if making else "the slots it was given are still being released"))
    if place < free and not settings.dispatch_paused:
        estimated = now
    elif not settings.dispatch_paused:
        active = store.list_jobs(statuses=ACTIVE, limit=max(1, settings.max_running_jobs * 4))[0]
        latest = store.latest_metric_values(j.id for j in active)
        finishes = sorted(f for f in (progress_fields(j, latest.get(j.id), now)["estimated_finish"] for j in active)
                          if f is not None)
        if place - free < len(finishes):
            estimated = finishes[place - free]
    return QueuePosition(position=place + 1, reason=reason, estimated_start=estimated)


def _slots_free_at(store: Store, cluster: ClusterPlan, job_id: str, missing: int, now: datetime) -> datetime | None:
    """When the running jobs that hold slots this job can use will have freed `missing` of them
    (their estimated finishes); None when they never free enough, or cannot be estimated."""
    shape = cluster.shapes[job_id]
    names = cluster.picture.pools_for(shape)
    if not names or shape.min_workers > cluster.picture.ceiling(names):
        return None
    if missing <= 0:
        return now
    running = [j for j in cluster.jobs.values() if j.status in ACTIVE and cluster.picture.pools_for(cluster.shapes[j.id]) & names]
    latest = store.latest_metric_values(j.id for j in running)
    finishes = sorted((f, cluster.holding[j.id]) for j in running
                      if (f := progress_fields(j, latest.get(j.id), now)["estimated_finish"]) is not None)
    freed = 0
    for finish, workers in finishes:
        freed += workers
        if freed >= missing:
            return finish
    return None
