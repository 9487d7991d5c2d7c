"""The cluster scheduling policy: which jobs run, on how many workers, and why.

Pure: it reads a picture of the cluster (pools of worker slots) and of the jobs (queued and
running, with their elastic range, priority, tenant and measured scaling), and returns a target
size for each job with the reason. The service's scheduler and the discrete-event simulator
(`bench/simulation.py`, `bench/scheduler.py`) call the same `plan`, so what the simulator
reports is what this code does.

Three policies:

- `elastic` (the product's): tenants share the cluster by weight (weighted max-min fair shares
  of what their jobs can use, guaranteed slots first, idle capacity lent to whoever can use it,
  as Kueue's cohorts borrow); within a tenant, higher priority first, then running jobs, then
  the oldest. Every admitted job starts at its minimum; the slots left over go one at a time to
  the job that gains the most throughput from one more worker (its measured speedup curve:
  goodput, as Pollux and Sia allocate), jobs of tenants under their share first. A running job
  keeps its size unless another job needs the room (it then shrinks towards its minimum, or is
  paused if its tenant is over its share or its priority is lower), and it grows only when the
  time saved over its remaining work outweighs the restart a resize costs.
- `fifo`: jobs in arrival order at their requested (maximum) size, the head of the queue
  blocking those behind it: dispatch by count, as the service did before this policy.
- `static`: each tenant gets its weighted share of the cluster as a fixed partition (no
  borrowing), FIFO at the requested size inside it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Mapping

POLICIES = ("elastic", "fifo", "static")
#: Named priorities; a number is taken as is (higher runs first).
PRIORITIES = {"low": 0, "normal": 50, "high": 100}


@dataclass(frozen=True)
class Pool:
    """A group of nodes whose worker slots are alike (GPU type, spot or on-demand)."""

    name: str
    slots: int  # worker slots placeable now
    spot: bool = False
    max_slots: int | None = None  # with the autoscaler's maximum for the group; None: `slots`

    @property
    def ceiling(self) -> int:
        return self.slots if self.max_slots is None else max(self.slots, self.max_slots)


@dataclass(frozen=True)
class Tenant:
    weight: float = 1.0
    guaranteed: int = 0  # slots the tenant is always entitled to (within its demand)


@dataclass(frozen=True)
class Demand:
    """A job as the policy sees it."""

    id: str
    tenant: str
    min_workers: int
    max_workers: int
    arrival: float  # any sortable time: earlier runs first among equals
    priority: int = PRIORITIES["normal"]
    workers: int = 0  # what it holds now: 0 = queued or paused
    #: Throughput at 1..max_workers workers relative to one worker (goodput); None = linear.
    speedup: tuple[float, ...] | None = None
    #: Work left, in seconds at one worker; None = unknown (growth is then always worth it).
    remaining_s: float | None = None
    #: Pools whose slots can hold a worker of this job (the planner's memory check); None = all.
    pools: frozenset[str] | None = None

    def rate(self, workers: int) -> float:
        """Throughput at `workers` workers, relative to one."""
        if workers <= 0:
            return 0.0
        if self.speedup is None:
            return float(workers)
        curve = self.speedup
        return curve[min(workers, len(curve)) - 1]


@dataclass(frozen=True)
class Decision:
    id: str
    workers: int  # target size: 0 = wait (queued) or pause (running)
    reason: str
    #: Slots per pool; the minimum goes on on-demand pools where it fits, growth on spot.
    placement: Mapping[str, int] = field(default_factory=dict)
    #: The job whose need moved this one (a shrink or a pause), if any.
    because_of: str | None = None

    @property
    def runs(self) -> bool:
        return self.workers > 0


@dataclass
class _State:
    free: dict[str, int]
    alloc: dict[str, int] = field(default_factory=dict)
    placement: dict[str, dict[str, int]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    because: dict[str, str] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)  # per tenant

    def can_place(self, demand: Demand, count: int) -> bool:
        return sum(n for pool, n in self.free.items() if _fits(demand, pool)) >= count

    def place(self, demand: Demand, count: int, pools: Mapping[str, Pool]) -> None:
        """Take `count` slots: on-demand pools first for a job's first workers, spot for growth."""
        placement = self.placement.setdefault(demand.id, {})
        growing = self.alloc.get(demand.id, 0) >= demand.min_workers
        order = sorted((p for p in self.free if _fits(demand, p) and self.free[p] > 0),
                       key=lambda p: (pools[p].spot != growing, -self.free[p], p))
        left = count
        for pool in order:
            take = min(left, self.free[pool])
            self.free[pool] -= take
            placement[pool] = placement.get(pool, 0) + take
            left -= take
            if not left:
                break
        assert left == 0, "place() called without room"
        self.alloc[demand.id] = self.alloc.get(demand.id, 0) + count
        self.used[demand.tenant] = self.used.get(demand.tenant, 0.0) + count


def _fits(demand: Demand, pool: str) -> bool:
    return demand.pools is None or pool in demand.pools


def fair_shares(total: float, demands: Mapping[str, float], tenants: Mapping[str, Tenant]) -> dict[str, float]:
    """Weighted max-min fair shares of `total` slots among tenants that want `demands[t]` slots:
    water-filling by weight, where a tenant's guaranteed slots are a floor under its share and
    its demand a ceiling over it; what a tenant cannot use goes to the others (borrowing)."""
    weight = {t: max(tenants.get(t, Tenant()).weight, 1e-9) for t in demands}
    floor = {t: min(float(demands[t]), float(tenants.get(t, Tenant()).guaranteed)) for t in demands}
    if sum(floor.values()) > total > 0:  # more guaranteed than exists: guarantees scale down alike
        floor = {t: f * total / sum(floor.values()) for t, f in floor.items()}
    share: dict[str, float] = {}
    active, left = set(demands), float(total)
    while active:
        level = left / sum(weight[t] for t in active)
        # Floors first (they lower the level for the rest), then ceilings (they raise it).
        fixed = {t: floor[t] for t in active if floor[t] >= level * weight[t]}
        if not fixed:
            fixed = {t: float(demands[t]) for t in active if demands[t] <= level * weight[t]}
        if not fixed:
            share.update({t: level * weight[t] for t in active})
            break
        share.update(fixed)
        active -= fixed.keys()
        left = max(0.0, left - sum(fixed.values()))
    return share


def speedup_curve(measured: Mapping[int, float], max_workers: int) -> tuple[float, ...] | None:
    """A job's throughput at 1..max_workers workers relative to one, fitted to what it measured
    (tokens/s per world size) with the usual model of a data-parallel job, k / (1 + s (k - 1)),
    where s is the fraction of a worker lost to communication per added worker. None until it
    has run at two sizes (the policy then assumes linear scaling)."""
    sizes = sorted(k for k, v in measured.items() if k >= 1 and v > 0)
    if len(sizes) < 2:
        return None
    a, b = sizes[0], sizes[-1]
    ratio = measured[b] / measured[a]
    denominator = ratio * a * (b - 1) - b * (a - 1)
    loss = (b - ratio * a) / denominator if denominator > 0 else 1.0
    loss = min(1.0, max(0.0, loss))
    return tuple(k / (1 + loss * (k - 1)) for k in range(1, max_workers + 1))


def priority_value(priority: str | int | None) -> int:
    """A job's priority as a number: the named ones, or the number as given."""
    if priority is None:
        return PRIORITIES["normal"]
    return PRIORITIES[priority] if isinstance(priority, str) else int(priority)


def fair_order(running: Mapping[str, int], queued: Iterable[Demand], tenants: Mapping[str, Tenant] | None = None,
               per_tenant_limit: int | None = None) -> list[Demand]:
    """The order in which queued jobs take job slots as they free up (weighted fair queueing):
    each next slot goes to the tenant furthest below its guaranteed jobs, else with the fewest
    running jobs per unit of weight (`running` counts each tenant's), and within a tenant to its
    highest priority, then oldest job. Tenants at `per_tenant_limit` come after the others."""
    tenants = dict(tenants or {})
    count = {t: float(n) for t, n in running.items()}
    lines: dict[str, list[Demand]] = {}
    waiting: dict[str, list[float]] = {}  # each tenant's queued arrivals, sorted: its longest wait first
    for job in sorted(queued, key=lambda j: (-j.priority, j.arrival, j.id)):
        lines.setdefault(job.tenant, []).append(job)
        bisect.insort(waiting.setdefault(job.tenant, []), job.arrival)
    order: list[Demand] = []
    while lines:
        def turn(t: str) -> tuple:
            share = tenants.get(t, Tenant())
            capped = per_tenant_limit is not None and count.get(t, 0.0) >= per_tenant_limit
            return (capped, count.get(t, 0.0) >= share.guaranteed, count.get(t, 0.0) / max(share.weight, 1e-9),
                    waiting[t][0], t)
        tenant = min(lines, key=turn)
        job = lines[tenant].pop(0)
        order.append(job)
        del waiting[tenant][bisect.bisect_left(waiting[tenant], job.arrival)]
        count[tenant] = count.get(tenant, 0.0) + 1
        if not lines[tenant]:
            del lines[tenant], waiting[tenant]
    return order


def plan(pools: Iterable[Pool], demands: Iterable[Demand], tenants: Mapping[str, Tenant] | None = None, *,
         policy: str = "elastic", resize_cost_s: float = 0.0) -> dict[str, Decision]:
    """A target size for every job in `demands` (queued ones included), with its reason."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
    pools = {p.name: p for p in pools}
    jobs = list(demands)
    tenants = dict(tenants or {})
    for job in jobs:
        if not 1 <= job.min_workers <= job.max_workers:
            raise ValueError(f"job {job.id}: need 1 <= min_workers <= max_workers, got {job.min_workers}..{job.max_workers}")
    if policy == "fifo":
        return _plan_fixed(pools, jobs, None)
    if policy == "static":
        return _plan_fixed(pools, jobs, tenants)
    decisions = _plan_elastic(pools, jobs, tenants, resize_cost_s)
    waiting = _worth_waiting(jobs, decisions, resize_cost_s)
    if waiting:
        finishing, eta_s = waiting
        starters = [j for j in jobs if not j.workers and decisions[j.id].runs]
        decisions = _plan_elastic(pools, [j for j in jobs if j.workers or not decisions[j.id].runs], tenants,
                                  resize_cost_s)
        for job in starters:
            decisions[job.id] = Decision(job.id, 0, f"waiting: a running job finishes in ~{eta_s:.0f} s, "
                                         "sooner than shrinking others would pay off", because_of=finishing)
    return decisions


def _worth_waiting(jobs: list[Demand], decisions: Mapping[str, Decision], resize_cost_s: float) -> tuple[str, float] | None:
    """Whether the jobs this plan starts should rather wait for running jobs to finish than take
    their room by shrinking others now: the starters' summed wait until enough slots free up is
    less than the restarts the shrinks cost (each shrunk job pays two: the shrink and growing back
    later). Returns the job whose completion frees the room and when, or None to go ahead."""
    if resize_cost_s <= 0:
        return None
    shrunk = [j for j in jobs if decisions[j.id].workers < j.workers]
    starters = [j for j in jobs if not j.workers and decisions[j.id].runs]
    if not shrunk or not starters:
        return None
    needed = sum(j.workers - decisions[j.id].workers for j in shrunk)
    steady = [j for j in jobs if j.workers and decisions[j.id].workers >= j.workers and j.remaining_s is not None]
    freed = 0
    for job in sorted(steady, key=lambda j: (j.remaining_s / j.rate(j.workers), j.id)):
        freed += job.workers
        if freed >= needed:
            eta_s = job.remaining_s / job.rate(job.workers)
            return (job.id, eta_s) if eta_s * len(starters) < 2 * resize_cost_s * len(shrunk) else None
    return None


def _plan_fixed(pools: dict[str, Pool], jobs: list[Demand], tenants: dict[str, Tenant] | None) -> dict[str, Decision]:
    """FIFO at the requested size; with `tenants`, inside fixed per-tenant partitions."""
    total = sum(p.slots for p in pools.values())
    state = _State(free={p: pools[p].slots for p in pools})
    limit: dict[str, float] | None = None
    if tenants is not None:
        names = {j.tenant for j in jobs} | set(tenants)
        weight = sum(tenants.get(t, Tenant()).weight for t in names) or 1.0
        limit = {t: total * tenants.get(t, Tenant()).weight / weight for t in names}
    blocked: set[str] = set()  # the queue (whole, or a tenant's) is blocked behind its head
    # Running jobs keep their slots: these policies never preempt.
    order = sorted(jobs, key=lambda j: (j.workers == 0, j.arrival, j.id))
    decisions: dict[str, Decision] = {}
    for job in order:
        size = job.workers or job.max_workers
        queue = job.tenant if limit is not None else ""
        if job.workers:
            if state.can_place(job, size):
                state.place(job, size, pools)
                decisions[job.id] = Decision(job.id, size, "running", dict(state.placement[job.id]))
                continue
            size = job.max_workers  # lost its slots (a preempted node): wait for all of them again
        room = limit is None or state.used.get(job.tenant, 0.0) + size <= limit[job.tenant] + 1e-9
        if queue not in blocked and room and state.can_place(job, size):
            state.place(job, size, pools)
            decisions[job.id] = Decision(job.id, size, "start", dict(state.placement[job.id]))
        else:
            blocked.add(queue)
            why = "waiting for its tenant's partition" if limit is not None and not room else "waiting in line"
            decisions[job.id] = Decision(job.id, 0, why)
    return decisions


def _plan_elastic(pools: dict[str, Pool], jobs: list[Demand], tenants: dict[str, Tenant],
                  resize_cost_s: float) -> dict[str, Decision]:
    total = sum(p.slots for p in pools.values())
    wants: dict[str, float] = {}
    for job in jobs:
        wants[job.tenant] = wants.get(job.tenant, 0.0) + job.max_workers
    share = fair_shares(total, wants, tenants)
    state = _State(free={p: pools[p].slots for p in pools})
    by_id = {j.id: j for j in jobs}

    def within_tenant(j: Demand) -> tuple:
        return (-j.priority, j.workers == 0, j.arrival, j.id)

    # 1. Minimums inside each tenant's share: the guaranteed pass. Tenants take turns, the one
    # furthest below its share first, so no tenant's backlog hides another's job.
    queues = {t: sorted((j for j in jobs if j.tenant == t), key=within_tenant) for t in wants}
    skipped: list[Demand] = []
    while any(queues.values()):
        tenant = min((t for t in queues if queues[t]),
                     key=lambda t: (state.used.get(t, 0.0) / max(share[t], 1e-9), t))
        job = queues[tenant].pop(0)
        if state.used.get(tenant, 0.0) + job.min_workers <= share[tenant] + 1e-9 and state.can_place(job, job.min_workers):
            state.place(job, job.min_workers, pools)
            state.reasons[job.id] = "within its tenant's share"
        else:
            skipped.append(job)
    # 2. Borrowing: the rest, by priority, running jobs first, then age, while slots are free.
    for job in sorted(skipped, key=within_tenant):
        if state.can_place(job, job.min_workers):
            state.place(job, job.min_workers, pools)
            state.reasons[job.id] = "borrowing idle capacity"
    admitted = [j for j in jobs if j.id in state.alloc]

    # 3. Running jobs back to their size where their tenant's share allows: never resize without
    # need. Within a priority, jobs with the least above their minimum first: the room a new job
    # takes then comes from as few jobs as possible (each shrink costs that job a restart).
    def restore_order(j: Demand) -> tuple:
        return (-j.priority, j.workers - state.alloc[j.id], j.arrival, j.id)

    for job in sorted((j for j in admitted if j.workers > state.alloc[j.id]), key=restore_order):
        keep = min(job.workers, job.max_workers) - state.alloc[job.id]
        room = int(share[job.tenant] + 1e-9 - state.used.get(job.tenant, 0.0))
        keep = min(keep, max(0, room))
        while keep > 0 and not state.can_place(job, keep):
            keep -= 1
        if keep > 0:
            state.place(job, keep, pools)

    # 4. Growth: one slot at a time to the job that gains the most from it, tenants under their
    # share first; a running job grows only if the time saved pays for the restart.
    def gain(job: Demand) -> float:
        k = state.alloc[job.id]
        return job.rate(k + 1) - job.rate(k)

    def worth_growing(job: Demand, target: int) -> bool:
        if job.workers == 0 or target <= job.workers or job.remaining_s is None or resize_cost_s <= 0:
            return True
        saved = job.remaining_s / job.rate(job.workers) - job.remaining_s / job.rate(target)
        return saved > 2 * resize_cost_s

    def first_slot(job: Demand) -> float:
        # A running job not yet resized in this plan pays a restart for its first added slot:
        # its gain counts half, so freed slots go to fewer jobs (those already growing, or
        # starting) rather than one to each.
        return 1.0 if job.workers == 0 or state.alloc[job.id] != job.workers else 0.5

    growable = {j.id for j in admitted}
    while growable:
        candidates = [by_id[i] for i in growable
                      if state.alloc[i] < by_id[i].max_workers and state.can_place(by_id[i], 1)]
        if not candidates:
            break
        # Tenants under their share first; then a running job back to the size it had (a resize
        # costs a restart, moving a slot between jobs costs two); then the largest gain.
        best = min(candidates, key=lambda j: (state.used.get(j.tenant, 0.0) >= share[j.tenant] - 1e-9,
                                              state.alloc[j.id] >= j.workers, -gain(j) * first_slot(j),
                                              -j.priority, j.arrival, j.id))
        if gain(best) <= 1e-9:
            growable.discard(best.id)
            continue
        state.place(best, 1, pools)
    # A running job whose growth would not pay for its restart stays at its size; the slots it
    # leaves go to the others (a second growth round without it).
    held_back = [j for j in admitted if j.workers and state.alloc[j.id] > j.workers and not worth_growing(j, state.alloc[j.id])]
    if held_back:
        for job in held_back:
            extra = state.alloc[job.id] - job.workers
            _release(state, job, extra, pools)
            state.reasons[job.id] = "growth would not pay for a restart"
        for job in sorted(admitted, key=lambda j: (-gain(j), j.arrival, j.id)):
            if job in held_back:
                continue
            while state.alloc[job.id] < job.max_workers and state.can_place(job, 1) and gain(job) > 1e-9:
                state.place(job, 1, pools)

    return _explain(jobs, state, share)


def _release(state: _State, job: Demand, count: int, pools: Mapping[str, Pool]) -> None:
    """Give back `count` of a job's slots, spot ones first."""
    placement = state.placement[job.id]
    left = count
    for pool in sorted(placement, key=lambda p: (not pools[p].spot, p)):
        take = min(left, placement[pool])
        placement[pool] -= take
        state.free[pool] += take
        left -= take
        if not left:
            break
    state.alloc[job.id] -= count
    state.used[job.tenant] -= count


def _explain(jobs: list[Demand], state: _State, share: dict[str, float]) -> dict[str, Decision]:
    """Each job's decision with its reason; a job that shrank or was paused names a job that
    took its room (the highest-priority job that started or grew)."""
    risers = sorted((j for j in jobs if state.alloc.get(j.id, 0) > j.workers),
                    key=lambda j: (-j.priority, j.arrival, j.id))
    decisions: dict[str, Decision] = {}
    for job in jobs:
        target = state.alloc.get(job.id, 0)
        placement = {p: n for p, n in state.placement.get(job.id, {}).items() if n}
        because = next((r.id for r in risers if r.id != job.id), None) if target < job.workers else None
        if target == 0:
            reason = ("paused for a job with a stronger claim" if job.workers else
                      "waiting: its minimum does not fit in the slots its tenant's share and the idle capacity leave")
        elif job.workers == 0:
            reason = f"start: {state.reasons.get(job.id, 'admitted')}"
        elif target > job.workers:
            reason = "grow: idle capacity, the most throughput per added worker"
        elif target < job.workers:
            reason = ("shrink: its tenant is over its share" if state.used.get(job.tenant, 0.0) > share[job.tenant] + 1e-9
                      else "shrink: room for another job")
        else:
            held_back = state.reasons.get(job.id, "")
            reason = held_back if held_back.startswith("growth") else "running"
        decisions[job.id] = Decision(job.id, target, reason, placement, because)
    return decisions
