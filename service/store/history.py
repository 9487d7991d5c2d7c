"""A job's history in the store: its events, metrics and checkpoints. `Store` (service/store/store.py)
has these methods; a write from a job's driver is fenced on its attempt, so a stale attempt's
driver writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

import sqlalchemy as sa

from eft.service.store.db import aware, once, retry_on_disconnect, utcnow, writing
from eft.service.store.schema import checkpoints, job_events, job_metrics, jobs
from eft.training import storage

#: Statements the hot paths run, built once (building one costs more CPU than running it).
_INSERT_EVENT = job_events.insert()
# Each job's newest metrics row, for the jobs `ids`.
_LATEST_METRICS = sa.select(job_metrics.c.job_id, job_metrics.c["values"]).where(job_metrics.c.id.in_(
    sa.select(sa.func.max(job_metrics.c.id)).where(job_metrics.c.job_id.in_(sa.bindparam("ids", expanding=True)))
    .group_by(job_metrics.c.job_id)))


@dataclass
class EventRecord:
    id: int
    job_id: str
    attempt: int
    created_at: datetime
    type: str
    level: str
    message: str
    data: dict[str, Any]


@retry_on_disconnect
class JobHistory:
    """Events, metrics and checkpoints of jobs (a part of `Store`, which gives it `engine`)."""

    engine: sa.Engine

    @staticmethod
    def _fence(conn: sa.Connection, job_id: str, attempt: int) -> bool:
        """Within a write transaction: whether the job is still on `attempt`, holding its row
        (a status change waits for this transaction), so a stale attempt writes nothing."""
        result = conn.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.attempt == attempt)
                              .values(updated_at=utcnow()))
        return result.rowcount == 1

    # --- events, metrics, checkpoints --------------------------------------------------------

    def insert_event(self, conn: sa.Connection, job_id: str, type_: str, message: str, *,
                     data: dict[str, Any] | None = None, level: str = "info") -> None:
        """`append_event` within the caller's transaction (`serialized`'s, say)."""
        attempt = conn.execute(sa.select(jobs.c.attempt).where(jobs.c.id == job_id)).scalar_one()
        self._insert_event(conn, job_id, attempt, type_, level, message, data)

    def _insert_event(self, conn, job_id, attempt, type_, level, message, data) -> None:  # noqa: ANN001
        conn.execute(_INSERT_EVENT, dict(job_id=job_id, attempt=attempt, created_at=utcnow(), type=type_,
                                         level=level, message=message, data=data or {}))

    @once
    def append_event(
        self,
        job_id: str,
        type_: str,
        message: str,
        *,
        data: dict[str, Any] | None = None,
        level: str = "info",
        attempt: int | None = None,
    ) -> bool:
        """Record an event that is not a status change (checkpoint saved, resized, ...). With
        `attempt`, only while the job is on that attempt; returns False when fenced off."""
        with writing(self.engine) as conn:
            if attempt is None:
                attempt = self.get_job(job_id).attempt
            elif not self._fence(conn, job_id, attempt):
                return False
            self._insert_event(conn, job_id, attempt, type_, level, message, data)
        return True

    def list_events(
        self, job_id: str, *, after: int | None = None, limit: int = 100, types: Iterable[str] | None = None,
    ) -> tuple[list[EventRecord], bool]:
        """Returns (events oldest first, has_more); only those of `types` when given."""
        query = job_events.select().where(job_events.c.job_id == job_id)
        if types is not None:
            query = query.where(job_events.c.type.in_(list(types)))
        if after is not None:
            query = query.where(job_events.c.id > after)
        query = query.order_by(job_events.c.id.asc()).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        events = [
            EventRecord(
                id=r.id, job_id=r.job_id, attempt=r.attempt, created_at=aware(r.created_at),
                type=r.type, level=r.level, message=r.message, data=r.data or {},
            )
            for r in rows[:limit]
        ]
        return events, len(rows) > limit

    @once
    def record_metrics(self, job_id: str, attempt: int, step: int, values: dict[str, float]) -> bool:
        """Store one step's metrics of `attempt`; False (nothing stored) when the job has moved
        on to another attempt."""
        with writing(self.engine) as conn:
            if not self._fence(conn, job_id, attempt):
                return False
            conn.execute(
                job_metrics.insert().values(
                    job_id=job_id, attempt=attempt, step=step, created_at=utcnow(), values=values
                )
            )
        return True

    def list_metrics(self, job_id: str, *, after_step: int | None = None,
                     limit: int | None = None) -> list[dict[str, Any]]:
        """One row per step, oldest first: the steps after `after_step`, at most `limit` of them
        (read from the database as such, so a long job's page costs what the page holds).
        Reports of one step are merged, later ones winning, so a step re-run by a later
        attempt shows that attempt's values."""
        where = [job_metrics.c.job_id == job_id]
        if after_step is not None:
            where.append(job_metrics.c.step > after_step)
        with self.engine.connect() as conn:
            if limit is not None:
                steps = sa.select(job_metrics.c.step).where(*where).distinct().order_by(job_metrics.c.step).limit(limit)
                last = conn.execute(sa.select(sa.func.max(steps.subquery().c.step))).scalar()
                if last is None:
                    return []
                where.append(job_metrics.c.step <= last)
            rows = conn.execute(job_metrics.select().where(*where).order_by(job_metrics.c.id.asc())).all()
        by_step: dict[int, dict[str, Any]] = {}
        for r in rows:
            merged = {**by_step.get(r.step, {}).get("values", {}), **r.values}
            by_step[r.step] = {"step": r.step, "created_at": aware(r.created_at), "values": merged}
        return [by_step[s] for s in sorted(by_step)]

    def latest_metric_values(self, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The values of each job's most recent metrics row (one query for a page of jobs)."""
        ids = list(job_ids)
        if not ids:
            return {}
        with self.engine.connect() as conn:
            return {job_id: dict(values or {}) for job_id, values in conn.execute(_LATEST_METRICS, {"ids": ids}).all()}

    def throughput_by_size(self, job_ids: Iterable[str]) -> dict[str, dict[int, float]]:
        """Each job's mean `tokens_per_s` per world size it has run at (one aggregate query): how
        its throughput scales, for the scheduler's growth decisions."""
        ids = list(job_ids)
        if not ids:
            return {}
        size = job_metrics.c["values"]["world_size"].as_float()
        rate = job_metrics.c["values"]["tokens_per_s"].as_float()
        query = (sa.select(job_metrics.c.job_id, size, sa.func.avg(rate))
                 .where(job_metrics.c.job_id.in_(ids), rate.is_not(None), size.is_not(None))
                 .group_by(job_metrics.c.job_id, size))
        out: dict[str, dict[int, float]] = {}
        with self.engine.connect() as conn:
            for job_id, workers, mean in conn.execute(query).all():
                if workers and mean:
                    out.setdefault(job_id, {})[int(workers)] = float(mean)
        return out

    @once
    def record_checkpoint(
        self, job_id: str, attempt: int, step: int, path: str, metrics: dict[str, Any], *,
        world_size: int | None = None, reason: str | None = None, size_bytes: int | None = None,
        save_seconds: float | None = None,
    ) -> bool:
        """Register a checkpoint `attempt` saved; False (not registered) when the job has moved
        on to another attempt."""
        with writing(self.engine) as conn:
            if not self._fence(conn, job_id, attempt):
                return False
            conn.execute(
                checkpoints.insert().values(
                    job_id=job_id, attempt=attempt, step=step, path=path, metrics=metrics,
                    world_size=world_size, reason=reason, size_bytes=size_bytes,
                    save_seconds=save_seconds, created_at=utcnow(),
                )
            )
        return True

    def list_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """Every checkpoint the job saved, oldest first; `available` tells whether its
        directory is still there (older ones are pruned to the job's `checkpoint.keep`)."""
        query = checkpoints.select().where(checkpoints.c.job_id == job_id).order_by(checkpoints.c.id)
        with self.engine.connect() as conn:
            return [
                {"step": r.step, "attempt": r.attempt, "path": r.path, "metrics": r.metrics,
                 "world_size": r.world_size, "reason": r.reason, "size_bytes": r.size_bytes,
                 "save_seconds": r.save_seconds, "available": storage.exists(r.path),
                 "created_at": aware(r.created_at)}
                for r in conn.execute(query).all()
            ]
