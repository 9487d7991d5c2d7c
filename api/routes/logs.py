"""`GET /jobs/{id}/logs`: a job's driver logs from Ray Jobs; `?follow=true` streams them as
server-sent events (`text/event-stream`) until the job ends."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.service.runs.logs import LogStreams

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("/{job_id}/logs", response_model=None)
async def job_logs(
    request: Request,
    job_id: str,
    service: JobServiceDep,
    tenant: CurrentTenant,
    follow: bool = False,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    tail: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    last_event_id: Annotated[str | None, Header(max_length=64)] = None,
) -> dict[str, Any] | EventSourceResponse:
    """The latest attempt's logs (or `attempt`'s) as JSON `{"data": text}`; with
    `follow=true`, server-sent events: one `data:` per line with the id `<attempt>:<line>`
    (send it back as `Last-Event-ID` to resume), `event: end` when the job ends, and a
    keep-alive comment every 15 s."""
    logs = service.logs
    if not follow:
        return await asyncio.to_thread(logs.text, job_id, tenant, attempt, tail)
    events = await logs.follow(job_id, tenant, attempt, last_event_id)
    streams: LogStreams = request.app.state.log_streams
    return EventSourceResponse(streams.bounded(request.state.tenant, events), ping=15,
                               headers={"X-Accel-Buffering": "no"})
