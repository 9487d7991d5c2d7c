"""The dispatch order of queued jobs, and each queued job's place in it.

Job slots (`EFT_MAX_RUNNING_JOBS`, `EFT_MAX_RUNNING_JOBS_PER_TENANT`) are shared between tenants
by weighted fair queueing (`eft.service.policy.fair_order`, weights and guaranteed jobs from
`EFT_TENANT_SHARES`): the next free slot goes to the tenant furthest below its share, and within
a tenant to its highest-priority, then oldest, job. The scheduler dispatches in this order; a
queued job's `queue` field reports its place, why it waits, and when a slot should free up (the
running jobs' estimated finishes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eft.service.policy import Demand, Tenant, fair_order, priority_value
from eft.service.progress import progress_fields
from eft.service.settings import Settings
from eft.service.store import JobRecord, Store, utcnow
from eft.types.jobs import JobStatus, QueuePosition

ACTIVE = (JobStatus.running, JobStatus.pausing, JobStatus.cancelling)


def _priority(raw: Any) -> int:
    try:
        return priority_value(raw if raw is None or not str(raw).isdigit() else int(raw))
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


def position(store: Store, settings: Settings, job: JobRecord, now: datetime | None = None) -> QueuePosition | None:
    """A queued job's place in line, why it waits, and when a slot should free up for it."""
    if job.status is not JobStatus.queued:
        return None
    now = now or utcnow()
    line = queue(store, settings)
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
