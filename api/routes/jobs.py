"""`/jobs`: create, list, retrieve, cancel, events, metrics, checkpoints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from eft.api.deps import CurrentPrincipal, CurrentTenant, IdempotencyKey, JobServiceDep
from eft.types.jobs import (
    Job,
    JobCheckpointList,
    JobCreate,
    JobEventList,
    JobList,
    JobMetricList,
    JobStatus,
)

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=Job,
             responses={200: {"model": Job, "description": "The first result of a repeated Idempotency-Key"}})
def create_job(
    body: JobCreate,
    service: JobServiceDep,
    principal: CurrentPrincipal,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Job:
    """Create a fine-tuning job. A repeated `Idempotency-Key` with the same body returns the
    first job (200); with another body, 409."""
    job, created = service.create(body, principal, idempotency_key)
    if not created:
        response.status_code = 200
    return job


@router.get("", response_model=JobList)
def list_jobs(
    service: JobServiceDep,
    tenant: CurrentTenant,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
    status: JobStatus | None = None,
) -> JobList:
    """Jobs newest first; pass `next_cursor` as `after` for the next page."""
    return service.list(tenant, limit, after, status)


@router.get("/{job_id}", response_model=Job)
def get_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> Job:
    return service.get(job_id, tenant)


@router.post("/{job_id}/cancel", response_model=Job)
def cancel_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> Job:
    return service.cancel(job_id, tenant)


@router.post("/{job_id}/pause", response_model=Job)
def pause_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> Job:
    """Pause a job: a running one checkpoints at once, releases its workers and ends `paused`
    (through `pausing`); a queued one is held back. 409 `job_not_pausable` otherwise."""
    return service.pause(job_id, tenant)


@router.post("/{job_id}/resume", response_model=Job)
def resume_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> Job:
    """Queue a paused job again; it resumes from its pause checkpoint at whatever world size
    the cluster gives (within its scaling). 409 `job_not_paused` otherwise."""
    return service.resume(job_id, tenant)


@router.get("/{job_id}/events", response_model=JobEventList)
def list_events(
    job_id: str,
    service: JobServiceDep,
    tenant: CurrentTenant,
    after: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JobEventList:
    """Events oldest first; pass the last event's `id` as `after` to follow."""
    return service.events(job_id, tenant, after, limit)


@router.get("/{job_id}/metrics", response_model=JobMetricList)
def list_metrics(
    job_id: str,
    service: JobServiceDep,
    tenant: CurrentTenant,
    after_step: Annotated[int | None, Query(ge=0, description="Steps after this one.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> JobMetricList:
    """One row per step, oldest first, at most `limit`; with `has_more`, pass the last row's
    `step` as `after_step` for the next page."""
    return service.metrics(job_id, tenant, after_step, limit)


@router.get("/{job_id}/checkpoints", response_model=JobCheckpointList)
def list_checkpoints(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> dict[str, Any]:
    """Every checkpoint the job saved, oldest first."""
    return {"object": "list", "data": service.checkpoints(job_id, tenant)}
