"""The OpenAI fine-tuning API mapped onto our jobs: one conversion each way.

- request: `model` is the base model, `hyperparameters` (or `method.supervised.hyperparameters`,
  or `method.dpo.hyperparameters` with `beta` for preference tuning, run as LoRA DPO)
  map `n_epochs` -> epochs, `batch_size` -> global batch, `learning_rate_multiplier` x 2e-4 ->
  learning rate; `seed`, `metadata` carry over; `suffix` becomes the job's name.
- object: our statuses become OpenAI's (`validating` -> `validating_files`, `cancelling` ->
  `cancelled`), times become Unix seconds, `fine_tuned_model` is the trained model's `ft:` id
  (service/serving/model_ids.py) and a checkpoint's `fine_tuned_model_checkpoint` its own; where their
  files are is `artifact_path` and the checkpoint's `path` on `/jobs`.
"""

from __future__ import annotations

from typing import Any

from eft.service.files.results import result_file_id
from eft.types.jobs import Hyperparameters, Job, JobCreate, JobEvent, JobMetric, JobStatus, objective_of
from eft.types.openai import (
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobCreate,
    FineTuningJobError,
    FineTuningJobEvent,
)
from eft.types.text import decimal_int

BASE_LEARNING_RATE = 2e-4
ORGANIZATION_PREFIX = "org-"
STATUS = {
    JobStatus.validating: "validating_files", JobStatus.queued: "queued",
    JobStatus.running: "running", JobStatus.pausing: "running", JobStatus.paused: "paused",
    JobStatus.cancelling: "cancelled",
    JobStatus.succeeded: "succeeded", JobStatus.failed: "failed", JobStatus.cancelled: "cancelled",
}
LEVEL = {"info": "info", "warning": "warn", "error": "error"}


def to_job_create(body: FineTuningJobCreate) -> JobCreate:
    """Our job request for an OpenAI create request; raises pydantic.ValidationError."""
    hp = body.resolved_hyperparameters
    hyper: dict[str, Any] = {}
    if hp.n_epochs != "auto":
        hyper["epochs"] = hp.n_epochs
    if hp.batch_size != "auto":
        hyper["global_batch_size"] = hp.batch_size
        hyper["micro_batch_size"] = min(hp.batch_size, Hyperparameters().micro_batch_size)
    if hp.learning_rate_multiplier != "auto":
        hyper["learning_rate"] = BASE_LEARNING_RATE * hp.learning_rate_multiplier
    if hp.max_steps is not None:
        hyper["max_steps"] = hp.max_steps
    if hp.max_seq_len is not None:
        hyper["max_seq_len"] = hp.max_seq_len
    if body.seed is not None:
        hyper["seed"] = body.seed
    method: dict[str, Any] = {"type": "lora"}
    if body.method is not None and body.method.type == "dpo":
        beta = getattr(hp, "beta", "auto")
        method = {"type": "dpo", **({} if beta == "auto" else {"beta": beta})}
    return JobCreate.model_validate({
        "model": body.model, "training_file": body.training_file,
        "validation_file": body.validation_file, "hyperparameters": hyper, "method": method,
        "name": body.suffix, "metadata": body.metadata or {},
        "integrations": [i.model_dump(exclude_none=True) for i in body.integrations or []],
    })


def _seconds(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def to_openai_job(job: Job, tenant: str) -> FineTuningJob:
    hp = job.hyperparameters
    hyperparameters = {
        "n_epochs": hp.epochs if hp.epochs is not None and hp.epochs == int(hp.epochs) else (hp.epochs or 1),
        "batch_size": hp.global_batch_size,
        "learning_rate_multiplier": round(hp.learning_rate / BASE_LEARNING_RATE, 6),
    }
    if hp.max_steps is not None:
        hyperparameters["max_steps"] = hp.max_steps
    error = None
    if job.error is not None:
        error = FineTuningJobError(code=job.error.code, message=job.error.message, param=job.error.param)
    return FineTuningJob(
        id=job.id, model=job.model, created_at=_seconds(job.created_at) or 0,
        finished_at=_seconds(job.finished_at), fine_tuned_model=job.fine_tuned_model,
        organization_id=ORGANIZATION_PREFIX + tenant, status=STATUS[job.status],
        training_file=job.training_file, validation_file=job.validation_file,
        hyperparameters=hyperparameters,
        method=(
            {"type": "dpo", "dpo": {"hyperparameters": {**hyperparameters, "beta": job.method.beta}}}
            if objective_of(job.method) == "dpo"
            else {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}}),
        trained_tokens=int(job.result_metrics["train_tokens"]) if "train_tokens" in job.result_metrics else None,
        error=error, seed=hp.seed, metadata=job.metadata or None, user_provided_suffix=job.name,
        result_files=[result_file_id(job.id)] if job.status is JobStatus.succeeded else [],
        estimated_finish=_seconds(job.estimated_finish), integrations=list(job.integrations),
        usage=_usage(job),
    )


def _usage(job: Job) -> dict[str, Any]:
    usage: dict[str, Any] = job.usage.model_dump()
    if job.estimate is not None:
        usage.update(estimated_gpu_hours=job.estimate.gpu_hours, estimated_worker_hours=job.estimate.worker_hours,
                     estimated_cost=job.estimate.cost, estimated_duration_s=job.estimate.duration_s)
    return usage


def to_openai_event(event: JobEvent) -> FineTuningJobEvent:
    return FineTuningJobEvent(
        id=f"ftevent-{event.id}", created_at=_seconds(event.created_at) or 0,
        level=LEVEL.get(event.level, "info"), message=event.message,
        type="metrics" if event.type == "metrics" else "message",
        data={"type": event.type, **event.data},
    )


def to_openai_metrics_event(job_id: str, metric: JobMetric) -> FineTuningJobEvent:
    """A logged step as OpenAI's `metrics` event: its names (`step`, `train_loss`, `valid_loss`)
    beside every value the step reported under ours."""
    values = metric.values
    data: dict[str, Any] = {"step": metric.step}
    if "loss" in values:
        data["train_loss"] = values["loss"]
    if "eval_loss" in values:
        data["valid_loss"] = values["eval_loss"]
    data.update({k: v for k, v in values.items() if k != "step"})
    message = f"Step {metric.step}" + (f": training loss={values['loss']:.4f}" if "loss" in values else "")
    return FineTuningJobEvent(id=f"ftevent-{job_id.removeprefix('ftjob-')}-step-{metric.step}",
                              created_at=_seconds(metric.created_at) or 0, level="info", message=message,
                              type="metrics", data=data)


def event_order(event_id: str) -> int:
    """Orders events of the same second: the store's event number, or a metrics event's step."""
    number = event_number(event_id)
    if number is not None:
        return number
    return int(event_id.rpartition("-step-")[2] or 0) if "-step-" in event_id else 0


def event_number(event_id: str | None) -> int | None:
    """The store's event number in an `ftevent-<n>` id; None when it is not one."""
    if event_id and event_id.startswith("ftevent-"):
        return decimal_int(event_id[8:])
    return None


def to_openai_checkpoint(job_id: str, checkpoint: dict[str, Any]) -> FineTuningJobCheckpoint:
    metrics = {k: v for k, v in (checkpoint.get("metrics") or {}).items() if isinstance(v, (int, float))}
    if "loss" in metrics:
        metrics.setdefault("train_loss", metrics["loss"])
    return FineTuningJobCheckpoint(
        id=f"ftckpt-{job_id.removeprefix('ftjob-')}-{checkpoint['attempt']}-{checkpoint['step']}",
        created_at=_seconds(checkpoint["created_at"]) or 0,
        fine_tuned_model_checkpoint=checkpoint["model"], fine_tuning_job_id=job_id,
        metrics={"step": checkpoint["step"], **metrics}, step_number=checkpoint["step"],
    )
