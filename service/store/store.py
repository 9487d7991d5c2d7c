"""The job store: the single source of truth for jobs, their events, metrics and checkpoints.

SQLAlchemy Core over SQLite by default (WAL, so the service and job drivers can share one file on
a single machine) or PostgreSQL by URL. Every status change goes through `Store.transition`, a
compare-and-set on the current status (and, for a job's driver, on its attempt number, which
fences off a stale driver of an earlier attempt) that appends the matching event in the same
transaction.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Callable, Iterable

import sqlalchemy as sa

from eft.types.jobs import JobStatus
from eft.service.jobs import lifecycle
from eft.service.store.db import aware, make_engine, once, retry_on_disconnect, serialized, tenant_key, utcnow, writing
from eft.service.errors import Conflict, JobNotFound
from eft.service.store.history import EventRecord, JobHistory  # noqa: F401 - EventRecord: the store's
# The tables live in service/store/schema.py; they are named here too, as the store's own.
from eft.service.store.schema import checkpoints, job_events, job_metrics, jobs, metadata  # noqa: F401

_aware = aware  # the store's older name


_last_id = [0, 0]  # (milliseconds, random part) of the last id this process made
_id_lock = threading.Lock()


def new_job_id() -> str:
    """`ftjob-` + 12 hex digits of milliseconds + 8 random: sorts by creation time. Ids one
    process makes in the same millisecond (or after the clock stepped back) keep that
    millisecond and count up from the last random part, as monotonic ULIDs do, so they sort
    in the order they were made."""
    with _id_lock:
        ms, rand = int(time.time() * 1000), secrets.randbits(32)
        last_ms, last_rand = _last_id
        if ms <= last_ms:
            ms, rand = (last_ms, last_rand + 1) if last_rand < 0xFFFFFFFF else (last_ms + 1, 0)
        _last_id[:] = [ms, rand]
    return f"ftjob-{ms:012x}{rand:08x}"


#: Statements the hot paths run, built once (building one costs more CPU than running it).
_INSERT_JOB = jobs.insert().returning(*jobs.c)
_GET_JOB = jobs.select().where(jobs.c.id == sa.bindparam("id"))
_GET_TENANT_JOB = _GET_JOB.where(jobs.c.tenant == sa.bindparam("tenant"))
# Per tenant and queued or not, over the jobs in `statuses`: the count, the queued jobs' newest
# change, and the id range (Store.queue_version).
_QUEUED = jobs.c.status == JobStatus.queued.value
_QUEUE_VERSION = (sa.select(jobs.c.tenant, _QUEUED, sa.func.count(), sa.func.max(sa.case((_QUEUED, jobs.c.updated_at))),
                            sa.func.min(jobs.c.id), sa.func.max(jobs.c.id))
                  .where(jobs.c.status.in_(sa.bindparam("statuses", expanding=True))).group_by(jobs.c.tenant, _QUEUED))


@dataclass
class JobRecord:
    id: str
    tenant: str
    name: str | None
    status: JobStatus
    request: dict[str, Any]
    config: dict[str, Any] | None
    attempt: int
    num_workers: int | None
    submission_id: str | None
    step: int
    total_steps: int | None
    error_code: str | None
    error_message: str | None
    error_param: str | None
    artifact_path: str | None
    result_metrics: dict[str, Any] | None
    restarts: int
    preemptions: int
    resizes: int
    lost_steps: int
    plan: dict[str, Any] | None
    schedule: dict[str, Any] | None
    estimate: dict[str, Any] | None
    worker_seconds: float
    spot_worker_seconds: float
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: sa.Row) -> JobRecord:
        values = {f.name: getattr(row, f.name) for f in fields(cls)}
        values["status"] = JobStatus(values["status"])
        for key in ("restarts", "preemptions", "resizes", "lost_steps", "worker_seconds", "spot_worker_seconds"):
            values[key] = values[key] or 0
        for key in ("created_at", "updated_at", "started_at", "finished_at"):
            values[key] = _aware(values[key])
        return cls(**values)


@retry_on_disconnect
class Store(JobHistory):
    """Jobs, events, metrics and checkpoints behind one SQLAlchemy engine.

    `migrate=True` (the service, at start) brings the schema to the newest migration first;
    job drivers open the store with `migrate=False`: the service that dispatched them has
    migrated already, and a driver never changes the schema under a running service.
    """

    def __init__(self, url: str, migrate: bool = True):
        self.url = url
        self.engine = make_engine(url)
        if migrate:
            from eft.service.store import migrations
            migrations.upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def serialized(self, key: str) -> contextlib.AbstractContextManager[sa.Connection]:
        return serialized(self.engine, key)

    # --- jobs ------------------------------------------------------------------------------

    @once
    def create_job(
        self,
        *,
        tenant: str,
        request: dict[str, Any],
        name: str | None = None,
        plan: dict[str, Any] | None = None,
        admit: Callable[[sa.Connection], None] | None = None,
        demand: tuple[float, float] = (0.0, 0.0),
    ) -> JobRecord:
        """Insert a job in `validating` with its `created` event and the planner's choice.
        (Repeated creates are told apart before this, by service/accounts/idempotency.py.)

        `admit(conn)`, when given, runs first in the same transaction, serialized with every
        other create of the tenant, and raises to refuse the job (a quota): no two concurrent
        creates can both pass a limit that only one fits under. `demand` is the (CPUs, GPUs) the
        job asks for at its largest size, which quotas sum."""
        now = utcnow()
        job_id = new_job_id()
        with self.serialized(tenant_key(tenant)) as conn:
            if admit is not None:
                admit(conn)
            # The stored row comes back with the insert (no second read).
            row = conn.execute(_INSERT_JOB, dict(
                id=job_id, tenant=tenant, name=name, status=JobStatus.validating.value,
                request=request, plan=plan, attempt=0, step=0, created_at=now, updated_at=now,
                demand_cpus=demand[0], demand_gpus=demand[1],
            )).one()
            self._insert_event(conn, job_id, 0, "created", "info", "job created", {})
        return JobRecord.from_row(row)

    def get_job(self, job_id: str, tenant: str | None = None) -> JobRecord:
        """Returns the job. Raises JobNotFound, also for another tenant's job."""
        query = _GET_JOB if tenant is None else _GET_TENANT_JOB
        with self.engine.connect() as conn:
            row = conn.execute(query, {"id": job_id, "tenant": tenant}).first()
        if row is None:
            raise JobNotFound(job_id)
        return JobRecord.from_row(row)

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        limit: int = 20,
        after: str | None = None,
        statuses: Iterable[JobStatus] | None = None,
        oldest_first: bool = False,
        metadata_filter: dict[str, str] | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """Returns (jobs, has_more): newest first, starting after the cursor job id. With
        `metadata_filter`, only jobs whose request's metadata holds every pair (`{}`: jobs with none),
        filtered in SQL (SQLite's json_extract, PostgreSQL's ->>)."""
        order = jobs.c.id.asc() if oldest_first else jobs.c.id.desc()
        query = jobs.select().order_by(order).limit(limit + 1)
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        if after:
            query = query.where(jobs.c.id > after if oldest_first else jobs.c.id < after)
        if statuses is not None:
            query = query.where(jobs.c.status.in_([JobStatus(s).value for s in statuses]))
        if metadata_filter:
            query = query.where(*(jobs.c.request[("metadata", key)].as_string() == value
                                  for key, value in metadata_filter.items()))
        elif metadata_filter is not None:
            stored = jobs.c.request["metadata"].as_string()
            query = query.where(sa.or_(stored.is_(None), stored == "{}"))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        records = [JobRecord.from_row(r) for r in rows[:limit]]
        return records, len(rows) > limit

    def active_by_tenant(self, statuses: Iterable[JobStatus], conn: sa.Connection | None = None) -> Counter[str]:
        """How many jobs each tenant has in `statuses` (one aggregate query)."""
        query = (sa.select(jobs.c.tenant, sa.func.count()).where(jobs.c.status.in_([JobStatus(s).value for s in statuses]))
                 .group_by(jobs.c.tenant))
        with contextlib.nullcontext(conn) if conn is not None else self.engine.connect() as c:
            return Counter({tenant: n for tenant, n in c.execute(query).all()})

    def queue_version(self, active: Iterable[JobStatus]) -> tuple[Any, ...]:
        """What the dispatch order depends on, in one aggregate query: per tenant, the queued
        jobs' count, newest change and id range, and how many jobs it has in `active` (not
        their progress, which moves on every step). Equal versions, equal orders (a job's
        tenant and priority never change while it is queued)."""
        statuses = [JobStatus.queued.value, *(JobStatus(s).value for s in active)]
        with self.engine.connect() as conn:
            rows = conn.execute(_QUEUE_VERSION, {"statuses": statuses}).all()
        return tuple(sorted(tuple(str(v) for v in row) for row in rows))

    def queue_lines(self) -> list[tuple[str, str, Any]]:
        """Every queued job as (id, tenant, requested priority), oldest first: what the dispatch
        order is computed from (a few columns, not the records)."""
        priority = jobs.c.request["priority"].as_string()
        query = (sa.select(jobs.c.id, jobs.c.tenant, priority).where(jobs.c.status == JobStatus.queued.value)
                 .order_by(jobs.c.id.asc()))
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query).all()]

    def get_jobs(self, ids: Iterable[str]) -> list[JobRecord]:
        """The jobs with these ids, in the given order (missing ones left out)."""
        ids = list(ids)
        if not ids:
            return []
        with self.engine.connect() as conn:
            rows = {r.id: JobRecord.from_row(r) for r in conn.execute(jobs.select().where(jobs.c.id.in_(ids))).all()}
        return [rows[i] for i in ids if i in rows]

    def queued_tenants(self) -> list[str]:
        """Tenants with queued jobs."""
        query = sa.select(jobs.c.tenant).where(jobs.c.status == JobStatus.queued.value).distinct()
        with self.engine.connect() as conn:
            return [t for (t,) in conn.execute(query).all()]

    @once
    def claim(self, job: JobRecord, *, submission_id: str, max_running: int, max_per_tenant: int,
              active: Iterable[JobStatus], message: str, **values: Any) -> JobRecord | None:
        """queued -> running as the job's next attempt, with its Ray submission id, only while
        the cluster runs fewer than `max_running` jobs and the tenant fewer than
        `max_per_tenant` (jobs in `active`): checked and claimed in one transaction, serialized
        with every other claim, so replicas dispatching at once never pass a limit together.
        Returns the claimed job, or None (a limit is reached, or another writer moved the job)."""
        attempt = job.attempt + 1
        with self.serialized("eft:dispatch") as conn:
            counts = self.active_by_tenant(active, conn)
            if sum(counts.values()) >= max_running or counts[job.tenant] >= max_per_tenant:
                return None
            if not self._move(conn, job, JobStatus.running, message, data={"attempt": attempt}, attempt=attempt,
                              submission_id=submission_id, **values):
                return None
        return self.get_job(job.id)

    def count_by_status(self, tenant: str | None = None) -> dict[str, int]:
        query = sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        with self.engine.connect() as conn:
            return {status: n for status, n in conn.execute(query).all()}

    def transition(
        self,
        job_id: str,
        target: JobStatus,
        message: str | None = None,
        *,
        expected_attempt: int | None = None,
        expected_status: JobStatus | None = None,
        event_type: str | None = None,
        data: dict[str, Any] | None = None,
        **values: Any,
    ) -> JobRecord:
        """Move a job to `target`, updating `values` and appending the event, atomically.

        `expected_attempt`, when given, must match the job's attempt (a driver's fencing
        token), and `expected_status` the status the caller decided on; `values` may set a new
        `attempt` (a dispatch claims the next one).
        Returns the updated job. Raises JobNotFound, lifecycle.IllegalTransition, or
        Conflict when the attempt does not match or the job changed underneath.
        """
        job = self.get_job(job_id)
        if expected_attempt is not None and job.attempt != expected_attempt:
            raise Conflict(
                f"job {job_id} is on attempt {job.attempt}, not {expected_attempt}: "
                "this writer is stale",
                code="stale_attempt",
            )
        if expected_status is not None and job.status is not expected_status:
            raise Conflict(f"job {job_id} is {job.status.value} now, not {expected_status.value}; retry",
                           code="concurrent_update")
        with writing(self.engine) as conn:
            if not self._move(conn, job, target, message, event_type=event_type, data=data, **values):
                raise Conflict(
                    f"job {job_id} changed while moving it to {target.value}; retry",
                    code="concurrent_update",
                )
        return self.get_job(job_id)

    def _move(self, conn: sa.Connection, job: JobRecord, target: JobStatus, message: str | None, *,
              event_type: str | None = None, data: dict[str, Any] | None = None, **values: Any) -> bool:
        """Within a write transaction: move `job` (as read) to `target` with `values`, and
        append the change's event. A compare-and-set on the status and attempt read: False
        when a concurrent writer moved the job first (nothing is written then)."""
        change = lifecycle.plan_transition(job.status, target, message, event_type=event_type, data=data)
        now = utcnow()
        values.setdefault("updated_at", now)
        if target in lifecycle.TERMINAL:
            values.setdefault("finished_at", now)
        result = conn.execute(
            jobs.update().where(jobs.c.id == job.id, jobs.c.status == job.status.value, jobs.c.attempt == job.attempt)
            .values(status=target.value, **values))
        if result.rowcount != 1:
            return False
        self._insert_event(conn, job.id, values.get("attempt", job.attempt), change.event_type, change.level,
                           change.message, change.data)
        from eft.service.webhooks import rules as webhooks
        webhooks.enqueue(conn, job, target, now)  # in this transaction: none is lost
        return True

    def update_job(self, job_id: str, *, attempt: int | None = None, **values: Any) -> bool:
        """Set non-status fields (progress, config). Returns False if the attempt is stale."""
        where = [jobs.c.id == job_id]
        if attempt is not None:
            where.append(jobs.c.attempt == attempt)
        with writing(self.engine) as conn:
            result = conn.execute(jobs.update().where(*where).values(updated_at=utcnow(), **values))
        return result.rowcount == 1

    def requeue(self, job: JobRecord, message: str, *, admit: Callable[[sa.Connection], None] | None = None,
                event_type: str | None = None, data: dict[str, Any] | None = None) -> JobRecord | None:
        """paused -> queued. `admit(conn)`, when given, runs first in the same transaction,
        serialized with the tenant's creates (`create_job`'s quotas), and may raise to refuse.
        Returns the job, or None when a concurrent writer moved it first."""
        with self.serialized(tenant_key(job.tenant)) as conn:
            if admit is not None:
                admit(conn)
            if not self._move(conn, job, JobStatus.queued, message, event_type=event_type, data=data):
                return None
        return self.get_job(job.id)

    def set_schedule(self, job_id: str, schedule: dict[str, Any] | None,
                     statuses: Iterable[JobStatus] | None = None) -> bool:
        """Record the cluster scheduler's decision on a job (no `updated_at` change: it is not the
        job's progress); with `statuses`, only while the job is in one of them."""
        where = [jobs.c.id == job_id]
        if statuses is not None:
            where.append(jobs.c.status.in_([JobStatus(s).value for s in statuses]))
        with writing(self.engine) as conn:
            result = conn.execute(jobs.update().where(*where).values(schedule=schedule))
        return result.rowcount == 1

    @once
    def add_counts(self, job_id: str, *, attempt: int | None = None, **deltas: int) -> bool:
        """Add to the recovery counters (restarts, preemptions, resizes, lost_steps); with
        `attempt`, only while the job is on that attempt. Returns False when fenced off."""
        values = {name: getattr(jobs.c, name) + int(delta) for name, delta in deltas.items() if delta}
        if not values:
            return True
        where = [jobs.c.id == job_id] + ([jobs.c.attempt == attempt] if attempt is not None else [])
        with writing(self.engine) as conn:
            result = conn.execute(jobs.update().where(*where).values(updated_at=utcnow(), **values))
        return result.rowcount == 1

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            return False
