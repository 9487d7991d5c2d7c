"""`GET /jobs/{id}/logs`: a job's driver logs from Ray Jobs; `?follow=true` streams them as
server-sent events (`text/event-stream`) until the job ends."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.service.logs import JobLogs

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("/{job_id}/logs", response_model=None)
async def job_logs(
    job_id: str,
    service: JobServiceDep,
    tenant: CurrentTenant,
    follow: bool = False,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    tail: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> dict[str, Any] | StreamingResponse:
    """The latest attempt's logs (or `attempt`'s) as JSON `{"data": text}`; with
    `follow=true`, server-sent events: one `data:` per line, `event: end` when the job ends."""
    logs = JobLogs(service.store, service.launcher)
    if not follow:
        return await asyncio.to_thread(logs.text, job_id, tenant, attempt, tail)
    events = await logs.follow(job_id, tenant, attempt)
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
