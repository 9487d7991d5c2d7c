"""Per-tenant quotas, checked when a job is created: active (validating, queued, running)
jobs, and the CPUs and GPUs those jobs ask for at their largest size.

The check runs inside the transaction that inserts the job, serialized with the tenant's other
creates (`Store.create_job(admit=...)`), so concurrent creates never pass a limit together.
Over a limit, a create answers 429 with `Retry-After`, unless the tenant's row says
`queue_over_quota`: its jobs are then accepted and wait in `queued` (the scheduler runs at most
`max_running_jobs_per_tenant` of them at once). Limits come from the `tenants` row, or from the
`EFT_MAX_*_PER_TENANT` settings where the row (or a value in it) is missing. Set a tenant's row
with `service/accounts/quotas.py:set_tenant_limits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from eft.types.jobs import JobCreate, JobStatus
from eft.service.errors import ServiceError
from eft.service.store.schema import tenants
from eft.service.settings import Settings
from eft.service.store.db import writing
from eft.service.store.store import Store, jobs, utcnow

ACTIVE = (JobStatus.validating, JobStatus.queued, JobStatus.running, JobStatus.pausing, JobStatus.cancelling)


class QuotaExceeded(ServiceError):
    status_code = 429
    type = "rate_limit_error"
    code = "quota_exceeded"

    def __init__(self, message: str, param: str, retry_after_s: int):
        super().__init__(message, param=param)
        self.headers = {"Retry-After": str(retry_after_s)}


@dataclass(frozen=True)
class TenantLimits:
    max_active_jobs: int
    max_cpus: float
    max_gpus: float
    queue_over_quota: bool


def limits_for(store: Store, tenant: str, settings: Settings, conn: sa.Connection | None = None) -> TenantLimits:
    if conn is None:
        with store.engine.connect() as own:
            return limits_for(store, tenant, settings, own)
    return _limits(conn.execute(tenants.select().where(tenants.c.id == tenant)).first(), settings)


def _limits(row: sa.Row | None, settings: Settings) -> TenantLimits:
    """A tenant's limits from its `tenants` row (None: no row), the settings' where unset."""
    pick = lambda name, default: getattr(row, name) if row is not None and getattr(row, name) is not None else default  # noqa: E731
    return TenantLimits(
        max_active_jobs=pick("max_active_jobs", settings.max_active_jobs_per_tenant),
        max_cpus=pick("max_cpus", settings.max_cpus_per_tenant),
        max_gpus=pick("max_gpus", settings.max_gpus_per_tenant),
        queue_over_quota=bool(row.queue_over_quota) if row is not None else False,
    )


def set_tenant_limits(store: Store, tenant: str, *, max_active_jobs: int | None = None,
                      max_cpus: float | None = None, max_gpus: float | None = None,
                      queue_over_quota: bool = False) -> None:
    """Create or replace a tenant's limits (None: the server's default)."""
    values = dict(max_active_jobs=max_active_jobs, max_cpus=max_cpus, max_gpus=max_gpus,
                  queue_over_quota=queue_over_quota)
    with writing(store.engine) as conn:
        updated = conn.execute(tenants.update().where(tenants.c.id == tenant).values(**values))
        if updated.rowcount == 0:
            conn.execute(tenants.insert().values(id=tenant, created_at=utcnow(), **values))


def demand(request: JobCreate) -> tuple[float, float]:
    """(CPUs, GPUs) a job asks for at its largest size."""
    workers = request.scaling.resolved_max_workers
    return workers * request.scaling.cpus_per_worker, float(workers if request.scaling.use_gpu else 0)


def _usage_query() -> sa.Select:
    """The tenant's limits and one aggregate over its active jobs (their demand is stored at
    create), in one query, for the bound parameter `tenant`. Built once: constructing it per
    create cost more CPU than running it."""
    tenant = sa.bindparam("tenant", type_=sa.String)
    usage = (sa.select(sa.func.count().label("active"),
                       sa.func.coalesce(sa.func.sum(jobs.c.demand_cpus), 0.0).label("cpus"),
                       sa.func.coalesce(sa.func.sum(jobs.c.demand_gpus), 0.0).label("gpus"))
             .where(jobs.c.tenant == tenant, jobs.c.status.in_([s.value for s in ACTIVE])).subquery())
    return sa.select(usage, tenants).select_from(usage.outerjoin(tenants, tenants.c.id == tenant))


_USAGE = _usage_query()


def check_quota(store: Store, tenant: str, request: JobCreate, settings: Settings,
                conn: sa.Connection | None = None) -> None:
    """Raise QuotaExceeded when `request` would take `tenant` over a limit. With `conn`, reads
    in that connection's transaction (the create's own)."""
    if conn is None:
        with store.engine.connect() as own:
            return check_quota(store, tenant, request, settings, own)
    row = conn.execute(_USAGE, {"tenant": tenant}).one()
    limits = _limits(row if row.id is not None else None, settings)
    if limits.queue_over_quota:
        return
    active, used_cpus, used_gpus = row.active, row.cpus, row.gpus
    cpus, gpus = demand(request)
    retry = settings.quota_retry_after_s
    if active + 1 > limits.max_active_jobs:
        raise QuotaExceeded(f"tenant {tenant!r} has {active} active jobs, the limit is "
                            f"{limits.max_active_jobs}: wait for one to finish or cancel one",
                            "tenant.max_active_jobs", retry)
    if used_cpus + cpus > limits.max_cpus:
        raise QuotaExceeded(f"this job asks for {cpus:g} CPUs and tenant {tenant!r} already uses "
                            f"{used_cpus:g} of {limits.max_cpus:g}: use fewer workers or wait",
                            "scaling.max_workers", retry)
    if used_gpus + gpus > limits.max_gpus:
        raise QuotaExceeded(f"this job asks for {gpus:g} GPUs and tenant {tenant!r} already uses "
                            f"{used_gpus:g} of {limits.max_gpus:g}: use fewer workers or wait",
                            "scaling.max_workers", retry)


def check_priority(tenant: str, request: JobCreate, settings: Settings) -> None:
    """Raise RequestInvalid when the job asks for a priority above its tenant's ceiling
    (`EFT_TENANT_SHARES`' max_priority)."""
    from eft.service.errors import Problem, RequestInvalid
    from eft.service.scheduling.policy import priority_value
    from eft.service.settings import TenantShare

    ceiling = settings.tenant_shares.get(tenant, TenantShare()).max_priority
    asked = priority_value(request.priority)
    if asked > ceiling:
        raise RequestInvalid(problems=[Problem(
            "priority", "priority_over_limit", f"priority {request.priority!r} ({asked}) is above tenant "
            f"{tenant!r}'s limit, {ceiling}: ask for {ceiling} or less (an operator sets it in EFT_TENANT_SHARES)")])
