"""A discrete-event simulation of a cluster running fine-tuning jobs under a scheduling policy.

It drives `eft.service.scheduling.policy.plan` (the code the service schedules with) over a trace of jobs
on a cluster of on-demand slots and spot nodes: jobs arrive, the policy sizes them, they make
progress at their scaling curve's rate, spot nodes are preempted (with a notice) and come back
after the autoscaler's delay, every start, resize and restart costs `restart_s` of no progress
(a checkpoint is taken at the notice or before a resize, so no step is trained twice), and jobs
finish. It reports completion times, utilisation, goodput, fairness and work lost per policy.

`generate_trace(jobs, seed)` makes the traces `bench/scheduler.py` reports on; the same seed
gives the same trace on any machine.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

from eft.service.scheduling.policy import PRIORITIES, Demand, Pool, Tenant, fair_shares, plan


@dataclass(frozen=True)
class SimJob:
    id: str
    tenant: str
    arrival: float
    work_s: float  # seconds of work at one worker
    min_workers: int
    max_workers: int
    sigma: float  # scaling loss: speedup(k) = k / (1 + sigma (k - 1))
    priority: int = PRIORITIES["normal"]
    #: The size a fixed-size system runs it at (the policies `fifo` and `static`); None = max_workers.
    request: int | None = None

    @property
    def speedup(self) -> tuple[float, ...]:
        return tuple(k / (1 + self.sigma * (k - 1)) for k in range(1, self.max_workers + 1))


@dataclass(frozen=True)
class Cluster:
    on_demand_slots: int = 32
    spot_nodes: int = 8
    slots_per_spot_node: int = 8
    #: Preemptions per spot node per hour, and the autoscaler's delay until a replacement joins.
    spot_preemptions_per_node_hour: float = 0.1
    spot_return_s: float = 600.0
    #: Seconds from a preemption notice to the node's loss, and what a checkpoint takes: a notice
    #: longer than the checkpoint loses no work; a shorter one loses the work since the last
    #: interval checkpoint (taken every `checkpoint_interval_s`).
    notice_s: float = 30.0
    checkpoint_s: float = 10.0
    checkpoint_interval_s: float = 600.0
    #: What a start, resize or restart costs: the worker group started and the checkpoint loaded.
    restart_s: float = 60.0

    @property
    def slots(self) -> int:
        return self.on_demand_slots + self.spot_nodes * self.slots_per_spot_node


@dataclass(frozen=True)
class Result:
    policy: str
    jobs: int
    mean_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    mean_wait_s: float
    makespan_s: float
    utilisation: float  # slots held by jobs / slots that existed
    goodput: float  # useful worker-equivalents (scaling and restarts counted) / slots that existed
    fairness: float  # Jain's index of tenants' use over their fair shares, time-weighted
    restarts: int
    lost_work_s: float  # work trained twice after preemptions with too short a notice
    completion: dict[str, float] = field(default_factory=dict, repr=False)


def generate_trace(jobs: int = 1000, seed: int = 0, cluster: Cluster = Cluster(), load: float = 0.9,
                   tenants: tuple[str, ...] = ("a", "b", "c", "d"),
                   tenant_mix: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1)) -> list[SimJob]:
    """Jobs arriving as a Poisson process at `load` times what the cluster can serve at the
    jobs' requested sizes; work log-normal (median one GPU-hour, heavy tail); requested sizes
    1-16 workers; 70% elastic (from a quarter of the request up to twice it), 30% rigid; scaling losses
    0-15% per added worker; 10% high priority, 20% low; tenants' shares of the jobs skewed."""
    rng = random.Random(seed)
    sizes, size_weights = (1, 2, 4, 8, 16), (0.3, 0.25, 0.2, 0.15, 0.1)
    drafts = []
    for i in range(jobs):
        size = rng.choices(sizes, size_weights)[0]
        elastic = rng.random() < 0.7
        sigma = rng.uniform(0.0, 0.15)
        work = rng.lognormvariate(math.log(3600.0), 1.2)
        roll = rng.random()
        priority = PRIORITIES["high"] if roll < 0.1 else PRIORITIES["low"] if roll < 0.3 else PRIORITIES["normal"]
        drafts.append(dict(id=f"job-{i:05d}", tenant=rng.choices(tenants, tenant_mix)[0], work_s=work,
                           min_workers=max(1, size // 4) if elastic else size,
                           max_workers=2 * size if elastic else size, request=size, sigma=sigma, priority=priority))
    # Slot-seconds a job holds at its requested size: the load the arrival rate is set against.
    held = [d["request"] * d["work_s"] / (d["request"] / (1 + d["sigma"] * (d["request"] - 1))) for d in drafts]
    rate = load * cluster.slots / (sum(held) / len(held))
    t = 0.0
    out = []
    for draft in drafts:
        t += rng.expovariate(rate)
        out.append(SimJob(arrival=t, **draft))
    return out


@dataclass
class _Running:
    workers: int = 0
    placement: dict[str, int] = field(default_factory=dict)
    busy_until: float = 0.0  # restarting (no progress) until then
    last_checkpoint: float = 0.0


def simulate(trace: list[SimJob], cluster: Cluster = Cluster(), policy: str = "elastic",
             tenants: dict[str, Tenant] | None = None, seed: int = 0) -> Result:
    """Run the trace to its end under `policy`; spot preemptions drawn from `seed`."""
    rng = random.Random(seed + 1)
    tenants = tenants or {}
    pools = {"on-demand": cluster.on_demand_slots}
    pools.update({f"spot-{n}": cluster.slots_per_spot_node for n in range(cluster.spot_nodes)})
    spot = [p for p in pools if p.startswith("spot-")]
    jobs = {j.id: j for j in trace}
    remaining = {j.id: j.work_s for j in trace}
    state: dict[str, _Running] = {}
    done: dict[str, float] = {}
    started: dict[str, float] = {}
    events: list[tuple[float, int, str, str]] = []  # (time, order, kind, subject)
    for order, job in enumerate(trace):
        heapq.heappush(events, (job.arrival, order, "arrive", job.id))
    seq = len(trace)

    def push(at: float, kind: str, subject: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, subject))

    hourly = cluster.spot_preemptions_per_node_hour / 3600.0
    if hourly > 0:
        for pool in spot:
            push(rng.expovariate(hourly), "notice", pool)
    now = 0.0
    held_area = avail_area = useful_area = fair_area = fair_time = 0.0
    restarts = 0
    lost = 0.0
    arrived: dict[str, None] = {}  # in arrival order: the run is the same in every process

    def advance(to: float) -> None:
        nonlocal held_area, avail_area, useful_area, fair_area, fair_time, now
        span = to - now
        if span <= 0:
            return
        avail = sum(pools.values())
        held = sum(r.workers for r in state.values())
        avail_area += avail * span
        held_area += held * span
        use: dict[str, float] = {}
        want: dict[str, float] = {}
        for job_id in (i for i in arrived if i not in done):
            job = jobs[job_id]
            want[job.tenant] = want.get(job.tenant, 0.0) + job.max_workers
        for job_id, run in state.items():
            job = jobs[job_id]
            use[job.tenant] = use.get(job.tenant, 0.0) + run.workers
            if run.workers:
                computing = max(0.0, to - max(now, run.busy_until))
                rate = job.speedup[run.workers - 1]
                remaining[job_id] -= rate * computing
                useful_area += rate * computing
        if len(want) > 1 and sum(want.values()) > avail:  # contention: is it shared fairly?
            shares = fair_shares(avail, want, tenants)
            ratios = [use.get(t, 0.0) / shares[t] for t in want if shares[t] > 0]
            if ratios and sum(r * r for r in ratios) > 0:
                fair_area += span * sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))
                fair_time += span
        now = to

    def replan() -> None:
        nonlocal restarts
        active = [jobs[i] for i in arrived if i not in done]
        demands = []
        for job in active:
            run = state.get(job.id)
            low, high = ((job.min_workers, job.max_workers) if policy == "elastic" else
                         (job.request or job.max_workers,) * 2)
            demands.append(Demand(
                id=job.id, tenant=job.tenant, min_workers=low, max_workers=high,
                arrival=job.arrival, priority=job.priority, workers=run.workers if run else 0,
                speedup=job.speedup, remaining_s=max(0.0, remaining[job.id]),
            ))
        pool_list = [Pool(name, slots, spot=name in spot) for name, slots in pools.items()]
        decisions = plan(pool_list, demands, tenants, policy=policy, resize_cost_s=cluster.restart_s)
        for job in active:
            decision = decisions[job.id]
            run = state.setdefault(job.id, _Running(last_checkpoint=now))
            if decision.workers != run.workers:
                if decision.workers:
                    # A start, a resize or a restart: checkpoint (a resize's is taken at once, so
                    # nothing is lost), start the new worker group, load the checkpoint.
                    restarts += run.workers > 0 or job.id in started
                    run.busy_until = now + cluster.restart_s
                    run.last_checkpoint = now
                    started.setdefault(job.id, now)
                run.workers = decision.workers
            run.placement = dict(decision.placement)
        for job_id in [i for i, r in state.items() if not r.workers and (i not in arrived or i in done)]:
            del state[job_id]
        # The next completion under the new sizes.
        for job in active:
            run = state.get(job.id)
            if run and run.workers:
                rate = job.speedup[run.workers - 1]
                finish = max(now, run.busy_until) + max(0.0, remaining[job.id]) / rate
                push(finish, "check", job.id)

    while events:
        at, _, kind, subject = heapq.heappop(events)
        advance(at)
        if kind == "arrive":
            arrived[subject] = None
        elif kind == "check":
            run = state.get(subject)
            if subject in done or not run or not run.workers or remaining[subject] > 1e-3:
                continue  # a stale estimate: the job was resized since
            done[subject] = now
            del state[subject]
        elif kind == "notice":
            push(now + cluster.notice_s, "lose", subject)
            continue  # the checkpoint at the notice costs `checkpoint_s` on the jobs there: counted in restarts
        elif kind == "lose":
            for job_id, run in state.items():
                held = run.placement.get(subject, 0)
                if not held:
                    continue
                if cluster.notice_s < cluster.checkpoint_s:  # no time to checkpoint: back to the last one
                    back = max(0.0, now - run.last_checkpoint) % cluster.checkpoint_interval_s
                    rate = jobs[job_id].speedup[run.workers - 1]
                    redo = back * rate
                    remaining[job_id] += redo
                    lost += redo
                run.workers = 0  # the worker group restarts at whatever size the policy gives it
            pools[subject] = 0
            push(now + rng.expovariate(1 / cluster.spot_return_s), "join", subject)
        elif kind == "join":
            pools[subject] = cluster.slots_per_spot_node
            push(now + rng.expovariate(hourly), "notice", subject)
        if len(done) == len(jobs):
            break
        replan()

    jct = sorted(done[j] - jobs[j].arrival for j in done)
    waits = [started[j] - jobs[j].arrival for j in done]
    return Result(
        policy=policy, jobs=len(done), mean_jct_s=sum(jct) / len(jct), p50_jct_s=_quantile(jct, 0.5),
        p99_jct_s=_quantile(jct, 0.99), mean_wait_s=sum(waits) / len(waits), makespan_s=now,
        utilisation=held_area / avail_area if avail_area else 0.0,
        goodput=useful_area / avail_area if avail_area else 0.0,
        fairness=fair_area / fair_time if fair_time else 1.0, restarts=restarts, lost_work_s=lost,
        completion={j: done[j] for j in done},
    )


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def scaled(trace: list[SimJob], **changes) -> list[SimJob]:
    """The trace with fields changed on every job (e.g. all rigid: `min_workers` = max)."""
    return [replace(j, **{k: (v(j) if callable(v) else v) for k, v in changes.items()}) for j in trace]
