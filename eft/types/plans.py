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


class PlanServingMemory(_Response):
    """A model server's engine, GB (10^9 bytes), term by term (eft/planner/serving.py)."""

    weights: float
    lora_slots: float = Field(description="The LoRA slots vLLM allocates up front (4 adapters of rank 64 per batch).")
    activations: float = Field(description="One scheduled step's activations and sampled logits.")
    kv_cache: float = Field(description="On a GPU what the share leaves; on a CPU node what the operator gives.")
    context: float = Field(description="The CUDA context and workspaces.")
    total: float


class PlanServing(_Response):
    """The model server for the job's result on one GPU of the cluster (or a CPU node), at the
    serving settings' defaults."""

    fits: bool
    reason: str = ""
    gpu_memory_utilization: float | None = Field(None, description="The share of the GPU vLLM takes.")
    memory_gb: PlanServingMemory | None = None
    kv_tokens: int | None = Field(None, description="Tokens the KV cache holds, all requests together.")


class Plan(_Response):
    """Every candidate configuration, fitting and fastest first, and the chosen one (null when
    none fits; `suggestions` then lists the nearest changes that fit)."""

    model: PlanModel | None = None
    chosen: PlanCandidate | None
    why: list[str] = Field(default_factory=list)
    candidates: list[PlanCandidate]
    suggestions: list[PlanSuggestion] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    serving: PlanServing | None = None
