"""Wire models of the REST API: what a request may say and what a response holds.

This module imports pydantic and nothing heavy, so the client package (`eft`) reuses it on a
laptop with no torch, ray or fastapi installed. Field names follow the request contract in
docs/api.md; unknown fields are refused so a typo never silently falls back to a default.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import Field

from eft.types._base import ListResponse, _Request, _Response


class JobStatus(str, Enum):
    """Statuses a user sees. Internal phases (scheduling, resizing) are events, not statuses."""

    def __str__(self) -> str:  # prints as `succeeded`, not `JobStatus.succeeded`
        return self.value

    validating = "validating"
    queued = "queued"
    running = "running"
    #: Asked to pause: the workers checkpoint at once and stop; then `paused`.
    pausing = "pausing"
    #: Stopped at a checkpoint, holding no workers; `POST /jobs/{id}/resume` queues it again.
    paused = "paused"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


# The job request has its own module; its names are this module's too (the wire contract's one import).
from eft.types.job_request import (  # noqa: F401
    CheckpointPolicy, DataOptions, DpoMethod, Evaluation, FullMethod, Hyperparameters, JobCreate, LoraMethod, Method, Optimizations, QloraMethod, RECORD_FIELDS, Recovery, Scaling, Strategy, Trackers, Tuning, objective_of, tuning_of,
)


# --- responses -----------------------------------------------------------------------------


class QueuePosition(_Response):
    """Where a queued job stands: its place in the dispatch order and why it waits."""

    position: int = Field(description="1 for the next job to start; tenants take turns by their weighted share.")
    reason: str = Field(description="Why it is not running yet.")
    estimated_start: datetime | None = Field(
        None, description="When a slot is expected to free up for it, from the running jobs' estimated finishes; "
        "null when no estimate can be made yet.")


class JobEstimate(_Response):
    """What the job should take, estimated when it was validated."""

    tokens: int = Field(description="Input tokens it will train: steps x global batch x the mean example length.")
    tokens_per_s_per_worker: float | None = Field(
        None, description="The throughput the estimate assumes: the median of finished similar jobs'.")
    duration_s: float | None = Field(None, description="Training time at its minimum workers; null without a basis.")
    duration_s_at_max: float | None = Field(None, description="Training time at its maximum workers.")
    worker_hours: float | None = None
    gpu_hours: float | None = None
    cost: float | None = Field(None, description="worker_hours at the deployment's prices (EFT_PRICES).")
    spot: bool = Field(False, description="Its workers run on spot nodes (priced as spot).")
    basis: str = Field(description="What the throughput comes from, or why there is no estimate yet.")


class JobUsage(_Response):
    """What the job has used so far: the worker time its groups held, spot and on-demand apart."""

    worker_hours: float = 0.0
    spot_worker_hours: float = 0.0
    on_demand_worker_hours: float = 0.0
    gpu_hours: float = 0.0
    cost: float | None = Field(None, description="At the prices the job was accepted under; null without prices.")
    currency: str | None = None


class JobError(_Response):
    """Why a job failed. `code` starts with `user_error.` or `platform_error.`."""

    code: str
    message: str
    param: str | None = None


class Job(_Response):
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    id: str
    status: JobStatus
    model: str
    training_file: str
    validation_file: str | None = None
    method: Method
    hyperparameters: Hyperparameters
    scaling: Scaling
    strategy: Strategy
    checkpoint: CheckpointPolicy
    eval: Evaluation = Field(default_factory=Evaluation)
    publish: Literal["last", "best"] = "last"
    recovery: Recovery = Field(default_factory=Recovery)
    optimizations: Optimizations = Field(default_factory=Optimizations)
    trackers: Trackers = Field(default_factory=Trackers)
    data: DataOptions = Field(default_factory=DataOptions)
    name: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    integrations: list[dict[str, Any]] = Field(default_factory=list)
    from_checkpoint: str | None = Field(None, description="The checkpoint this job continues from, `<job id>:<step>`.")
    restore_optimizer: bool = True
    webhook_url: str | None = None
    priority: str | int = "normal"
    queue: QueuePosition | None = Field(None, description="For a queued job: its place in line, and why it waits.")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempt: int = 0
    num_workers: int | None = None
    step: int = 0
    total_steps: int | None = None
    error: JobError | None = None
    artifact_path: str | None = Field(
        None, description="Where the trained adapter (or model) was written: a directory or an object-store URI.")
    fine_tuned_model: str | None = Field(
        None, description="The trained model's id once the job succeeded, `ft:<base>:<name or tenant>:<job id>`: "
        "the name `/v1/models` lists. Its files are at `artifact_path`.")
    ray_submission_id: str | None = None
    restarts: int = Field(0, description="Worker-group restarts after platform failures.")
    preemptions: int = Field(0, description="Node preemptions (drains) the job rode out.")
    resizes: int = Field(0, description="Elastic changes of the number of workers.")
    lost_steps: int = Field(
        0, description="Optimizer steps trained again because they came after the last checkpoint."
    )
    resolved: dict[str, Any] | None = Field(
        None, description="The configuration the job runs with once validated: strategy, offload, "
        "gradient_checkpointing, attention, precision and the planner's predicted_memory_gb."
    )
    result_metrics: dict[str, float] = Field(default_factory=dict)
    progress: float | None = Field(
        None, ge=0, le=1, description="Share of the optimizer steps done, 0-1, once the job is planned."
    )
    estimated_finish: datetime | None = Field(
        None, description="When a running job should finish, from its recent step time."
    )
    trained_tokens: int | None = Field(
        None, description="Input tokens trained so far (steps trained again after a resume count again)."
    )
    estimate: JobEstimate | None = Field(None, description="Duration, worker hours and cost, estimated at validation.")
    usage: JobUsage = Field(default_factory=JobUsage, description="Worker hours and cost used so far.")
    schedule: dict[str, Any] | None = Field(
        None, description="The cluster scheduler's latest decision: `workers` (its size; 0 with `paused`: paused "
        "for another job, resumed when room frees), `reason`, `because_of` (the job that needed the room).")


class JobLogs(_Response):
    object: Literal["fine_tuning.job.logs"] = "fine_tuning.job.logs"
    job_id: str
    attempt: int
    ray_submission_id: str
    data: str = Field(description="The attempt's driver output, as Ray Jobs captured it.")


class JobList(ListResponse):
    object: Literal["list"] = "list"
    data: list[Job]
    has_more: bool
    next_cursor: str | None = None


class JobEvent(_Response):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: int
    job_id: str
    created_at: datetime
    attempt: int = Field(0, description="The dispatch attempt the event belongs to.")
    type: str
    level: Literal["info", "warning", "error"] = "info"
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class JobEventList(ListResponse):
    object: Literal["list"] = "list"
    data: list[JobEvent]
    has_more: bool


class JobMetric(_Response):
    step: int
    created_at: datetime
    values: dict[str, float]


class JobMetricList(ListResponse):
    object: Literal["list"] = "list"
    data: list[JobMetric]
    has_more: bool = False


class JobCheckpoint(_Response):
    step: int
    attempt: int
    path: str = Field(description="Where it is: a directory or an object-store URI.")
    model: str | None = Field(None, description="This checkpoint's model id: the job's `ft:` id and `:ckpt-<step>`.")
    metrics: dict[str, Any] | None = None
    world_size: int | None = None
    reason: str | None = Field(None, description="interval, preemption, final, ...")
    size_bytes: int | None = None
    save_seconds: float | None = None
    available: bool = Field(description="False once pruned to the job's checkpoint.keep.")
    created_at: datetime
    eval_loss: float | None = Field(None, description="The validation loss at this step, when one was computed.")
    best: bool = Field(False, description="The kept checkpoint with the lowest validation loss.")


class ArtifactFile(_Response):
    path: str = Field(description="Relative to the artifact (or checkpoint) directory.")
    bytes: int
    sha256: str


class ArtifactFileList(ListResponse):
    """The files of a job's artifact, or of one of its checkpoints (`checkpoint`: its step)."""

    object: Literal["list"] = "list"
    job_id: str
    checkpoint: int | None = None
    export: str | None = None
    data: list[ArtifactFile]


class ExportCreate(_Request):
    kind: Literal["merged", "adapter"] = Field(
        "merged", description="merged: the adapter folded into the base model's weights, in its dtype, as "
        "safetensors with tokenizer and config; adapter: the PEFT adapter as published.")
    hub_repo: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", max_length=200,
        description="Also push it to this Hugging Face Hub model repository (created if needed), with the "
        "token the operator gave the service.")
    hub_private: bool = Field(True, description="Create the Hub repository private.")


class Export(_Response):
    object: Literal["export"] = "export"
    id: int = Field(description="0 for the adapter; merged exports count from 1.")
    job_id: str
    kind: Literal["merged", "adapter"]
    status: Literal["running", "succeeded", "failed"]
    path: str | None = Field(None, description="Where it is (or will be) written.")
    error: str | None = None
    bytes: int | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    hub_repo: str | None = None
    hub_url: str | None = Field(None, description="The Hub commit that holds it, once pushed.")


class ExportList(ListResponse):
    object: Literal["list"] = "list"
    data: list[Export]


class JobCheckpointList(ListResponse):
    object: Literal["list"] = "list"
    data: list[JobCheckpoint]


class Caller(_Response):
    """Who the key belongs to (`GET /me`)."""

    tenant: str
    role: str
    ray_dashboard_url: str | None = Field(
        None, description="Ray's dashboard, named to admins only: its Jobs API runs arbitrary code."
    )


class Health(_Response):
    status: Literal["ok", "degraded"]
    version: str
    database: bool
    ray: bool | None = None


class ErrorDetail(_Response):
    type: str
    code: str
    message: str
    param: str | None = None
    errors: list[dict[str, Any]] | None = None


class ErrorResponse(_Response):
    error: ErrorDetail


# --- the planner (POST /plan) --------------------------------------------------------------
