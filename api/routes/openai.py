"""OpenAI-compatible `/v1`: `files` and `fine_tuning/jobs` with OpenAI's shapes, so the official
`openai` package works with `base_url="http://<service>/v1"`. Our `/jobs` API stays the primary
one; these routes map onto it (service/jobs/openai.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from eft.api.deps import CurrentPrincipal, CurrentTenant, IdempotencyKey, JobServiceDep
from eft.types.openai import (
    FineTuningJob,
    FineTuningJobCheckpointList,
    FineTuningJobCreate,
    FineTuningJobEventList,
    FineTuningJobList,
)
from eft.service.jobs.openai import (
    event_order, to_openai_metrics_event,
    to_job_create,
    to_openai_checkpoint,
    to_openai_event,
    to_openai_job,
)

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["openai"])


def _owner(service: JobServiceDep, job_id: str, tenant: str | None) -> str:
    return service.owner(job_id, tenant)


@router.post("", response_model=FineTuningJob)
def create_fine_tuning_job(
    body: FineTuningJobCreate,
    service: JobServiceDep,
    principal: CurrentPrincipal,
    idempotency_key: IdempotencyKey = None,
) -> FineTuningJob:
    """Create a job (OpenAI's request); answers 200 with the job, as OpenAI does."""
    job, _ = service.create(to_job_create(body), principal, idempotency_key,
                            endpoint="POST /v1/fine_tuning/jobs", body=body)
    return to_openai_job(job, principal.tenant)


def metadata_filter(request: Request) -> dict[str, str] | None:
    """OpenAI's list filter: `metadata[key]=value` (every pair must match), or `metadata=null`
    (jobs without metadata); None when the query has neither."""
    wanted = {k[len("metadata["):-1]: v for k, v in request.query_params.multi_items()
              if k.startswith("metadata[") and k.endswith("]")}
    if wanted:
        return wanted
    return {} if request.query_params.get("metadata") == "null" else None


@router.get("", response_model=FineTuningJobList)
def list_fine_tuning_jobs(
    request: Request,
    service: JobServiceDep,
    tenant: CurrentTenant,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FineTuningJobList:
    """Jobs newest first; `after` is the last job id of the previous page; `metadata[k]=v`
    keeps the jobs whose metadata has every such pair (`metadata=null`: those with none)."""
    page = service.list(tenant, limit, after, None, metadata=metadata_filter(request))
    return FineTuningJobList(data=[to_openai_job(j, tenant or _owner(service, j.id, tenant)) for j in page.data],
                             has_more=page.has_more)


@router.get("/{job_id}", response_model=FineTuningJob)
def retrieve_fine_tuning_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> FineTuningJob:
    return to_openai_job(service.get(job_id, tenant), _owner(service, job_id, tenant))


@router.post("/{job_id}/cancel", response_model=FineTuningJob)
def cancel_fine_tuning_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> FineTuningJob:
    return to_openai_job(service.cancel(job_id, tenant), _owner(service, job_id, tenant))


@router.post("/{job_id}/pause", response_model=FineTuningJob)
def pause_fine_tuning_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> FineTuningJob:
    return to_openai_job(service.pause(job_id, tenant), _owner(service, job_id, tenant))


@router.post("/{job_id}/resume", response_model=FineTuningJob)
def resume_fine_tuning_job(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> FineTuningJob:
    return to_openai_job(service.resume(job_id, tenant), _owner(service, job_id, tenant))


@router.get("/{job_id}/events", response_model=FineTuningJobEventList)
def list_fine_tuning_events(
    job_id: str,
    service: JobServiceDep,
    tenant: CurrentTenant,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> FineTuningJobEventList:
    """Events newest first, as OpenAI lists them, the job's messages and its step metrics
    (`type: "metrics"`, one per logged step) together; `after` is the last event id of the
    previous page."""
    events = [to_openai_event(e) for e in service.events(job_id, tenant, None, 100_000).data]
    events += [to_openai_metrics_event(job_id, m) for m in service.metrics(job_id, tenant, limit=100_000).data]
    # Newest first; a step's metrics after the messages of the same second.
    newest_first = sorted(events, key=lambda e: (e.created_at, e.type == "metrics", event_order(e.id)), reverse=True)
    if after is not None:
        ids = [e.id for e in newest_first]
        newest_first = newest_first[ids.index(after) + 1:] if after in ids else []
    page = newest_first[:limit]
    return FineTuningJobEventList(data=page, has_more=len(newest_first) > limit)


@router.get("/{job_id}/checkpoints", response_model=FineTuningJobCheckpointList)
def list_fine_tuning_checkpoints(
    job_id: str,
    service: JobServiceDep,
    tenant: CurrentTenant,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> FineTuningJobCheckpointList:
    """Checkpoints newest first; `after` is the last checkpoint id of the previous page."""
    items = [to_openai_checkpoint(job_id, c) for c in reversed(service.checkpoints(job_id, tenant))]
    if after:
        ids = [c.id for c in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return FineTuningJobCheckpointList(data=page, has_more=len(items) > limit,
                                       first_id=page[0].id if page else None,
                                       last_id=page[-1].id if page else None)
