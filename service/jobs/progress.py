"""Progress, ETA and trained tokens of a job, derived from its record and latest metrics."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from eft.types.jobs import JobStatus
from eft.service.store.store import JobRecord, utcnow


def progress_fields(job: JobRecord, latest: dict[str, Any] | None, now: datetime | None = None) -> dict[str, Any]:
    """`progress` (0-1), `estimated_finish` and `trained_tokens` for the wire job.

    The ETA of a running job is its remaining steps times the step time rank 0 last reported;
    before the first report, the average time per step since it started (which includes model
    loading, so it runs long early on)."""
    latest = latest or {}
    fields: dict[str, Any] = {"progress": None, "estimated_finish": None, "trained_tokens": None}
    if "trained_tokens" in latest:
        fields["trained_tokens"] = int(latest["trained_tokens"])
    if job.status is JobStatus.succeeded:
        fields["progress"] = 1.0
        return fields
    if not job.total_steps:
        return fields
    fields["progress"] = min(1.0, max(0.0, job.step / job.total_steps))
    if job.status is not JobStatus.running or job.step <= 0:
        return fields
    now = now or utcnow()
    step_time = latest.get("step_time_s")
    if not step_time and job.started_at is not None:
        step_time = (now - job.started_at).total_seconds() / job.step
    if step_time:
        remaining = max(0, job.total_steps - job.step)
        fields["estimated_finish"] = now + timedelta(seconds=remaining * float(step_time))
    return fields
