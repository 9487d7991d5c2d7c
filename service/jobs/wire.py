"""A stored job as the API shows it (`Job`, the wire type of eft/types/jobs.py): its request's
fields, its state and counters, what it resolved to run with, its estimate and usage, its
progress, and the id of the model it trained."""

from __future__ import annotations

from typing import Any

from eft.service.scheduling import estimates
from eft.service.serving.model_ids import fine_tuned_model_id
from eft.service.jobs.progress import progress_fields
from eft.service.store.store import JobRecord
from eft.types.jobs import Job, JobCreate, JobError, JobEstimate, JobStatus

RESOLVED_KEYS = ("strategy", "offload", "gradient_checkpointing", "attention", "precision", "packing",
                 "predicted_memory_gb", "total_steps")


def model_id(job: JobRecord) -> str:
    """The id of the model `job` trains: `ft:<base>:<name or tenant>:<job id>`."""
    return fine_tuned_model_id(job.request["model"], job.id, job.name, job.tenant)


def resolved_config(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a validated job runs with, and (a continued job) where it started from."""
    if not config:
        return None
    resolved = {k: config[k] for k in RESOLVED_KEYS if k in config}
    if config.get("init_job"):
        resolved["continued_from"] = {"job_id": config["init_job"], "step": config.get("init_step", 0),
                                      "optimizer_state": bool(config.get("init_optimizer", True))}
    return resolved


def to_wire(job: JobRecord, latest: dict[str, Any] | None = None) -> Job:
    """The wire job; `latest` (the newest metrics values) adds trained tokens and a finer ETA."""
    request = JobCreate.model_validate(job.request)
    error = None
    if job.error_code:
        error = JobError(code=job.error_code, message=job.error_message or "", param=job.error_param)
    return Job(
        id=job.id, status=job.status, **request.model_dump(),
        created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
        attempt=job.attempt, num_workers=job.num_workers, step=job.step,
        total_steps=job.total_steps, error=error, artifact_path=job.artifact_path,
        fine_tuned_model=model_id(job) if job.status is JobStatus.succeeded and job.artifact_path else None,
        ray_submission_id=job.submission_id, result_metrics=job.result_metrics or {},
        restarts=job.restarts, preemptions=job.preemptions, resizes=job.resizes,
        lost_steps=job.lost_steps,
        resolved=resolved_config(job.config),
        estimate=_estimate(job.estimate),
        usage=estimates.usage(job.worker_seconds, job.spot_worker_seconds, job.estimate),
        schedule=job.schedule,
        **progress_fields(job, latest),
    )


def _estimate(stored: dict[str, Any] | None) -> JobEstimate | None:
    if not stored:
        return None
    return JobEstimate.model_validate({k: v for k, v in stored.items() if k in JobEstimate.model_fields})
