"""Wire models of `POST /plan` and of the planner's answer (pydantic only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eft.types._base import _Request, _Response
from eft.types.jobs import JobCreate


class Cluster(_Request):
    """The GPUs a job would train on."""

    gpus: int = Field(..., ge=1, le=4096, description="GPUs the job trains on, one per worker.")
    gpu_memory_gb: float = Field(
        ..., gt=0, le=4096, description="Memory of one GPU, GB of 10^9 bytes (e.g. 32, 80)."
    )
    gpu_type: str | None = Field(
        None, min_length=1, max_length=64,
        description="e.g. 'V100', 'A100', 'H100': flash_attention_2 is considered only on a known "
        "Ampere or newer GPU.",
    )


class PlanRequest(JobCreate):
    """A job request plus the cluster it would run on. The planner reads `model`, `method`,
    `hyperparameters.max_seq_len`, `hyperparameters.micro_batch_size` and `strategy` ("auto"
    weighs every strategy, another value only that one); `training_file` may be left out."""

    training_file: str | None = Field(  # type: ignore[assignment]
        None, min_length=1, max_length=2048, description="Accepted for symmetry with a job; not read."
    )
    cluster: Cluster


class PlanMemory(_Response):
    """Predicted peak memory of one GPU, GB (10^9 bytes), term by term."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    reserve: float = Field(0.0, description="The GPU caching allocator's reserve beyond the allocated peak.")
    communicator: float = Field(0.0, description="NCCL's buffers on a GPU of several.")
    total: float = Field(description="What the GPU must hold at the peak: every term above.")


class PlanCandidate(_Response):
    strategy: Literal["ddp", "fsdp", "zero1", "zero2", "zero3"]
    offload: Literal["none", "optimizer", "optimizer+params"]
    gradient_checkpointing: bool
    attention: Literal["sdpa", "eager", "flash_attention_2"]
    fits: bool
    relative_time: float = Field(description="Step time relative to DDP + sdpa, no offload or GC.")
    memory_gb: PlanMemory
    reason: str = ""


class PlanSuggestion(_Response):
    change: Literal["strategy", "offload", "micro_batch", "gpus", "method", "seq_len"]
    value: str | int
    message: str
    chosen: PlanCandidate


class PlanModel(_Response):
    name: str
    parameters: int
    trainable_parameters: int
    method: str


class Plan(_Response):
    """Every candidate configuration, fitting and fastest first, and the chosen one (null when
    none fits; `suggestions` then lists the nearest changes that fit)."""

    model: PlanModel | None = None
    chosen: PlanCandidate | None
    why: list[str] = Field(default_factory=list)
    candidates: list[PlanCandidate]
    suggestions: list[PlanSuggestion] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
