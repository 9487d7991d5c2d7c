"""What the planner is asked (`PlanSpec`) and the configurations it weighs (`Configuration`).

A configuration is one point of the study's optimization space: a data-parallel strategy (DDP,
FSDP full sharding, DeepSpeed ZeRO stage 1, 2 or 3), CPU offload, gradient checkpointing and an
attention kernel. The method (full, LoRA, QLoRA) is the user's choice and stays fixed in a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eft.planner.architectures import Architecture, PlannerError

STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
OFFLOADS = ("none", "optimizer", "optimizer+params")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")
METHODS = ("full", "lora", "qlora")
PRECISIONS = ("bf16", "fp16", "fp32")
DEVICES = ("cuda", "cpu")

#: Offloads each strategy can do. DDP has none; DeepSpeed offloads optimizer states at any stage
#: (ZeRO-Offload) and parameters only at stage 3 (ZeRO-Infinity); FSDP's CPUOffload moves
#: parameters, gradients and the optimizer step together.
OFFLOADS_BY_STRATEGY = {
    "ddp": ("none",),
    "zero1": ("none", "optimizer"),
    "zero2": ("none", "optimizer"),
    "zero3": ("none", "optimizer", "optimizer+params"),
    "fsdp": ("none", "optimizer+params"),
}

#: Ties in predicted time go to the configuration earlier here: the study's DeepSpeed stages
#: first (the configurations its Figure 4 recommends), then FSDP and DDP.
STRATEGY_PREFERENCE = ("zero1", "zero2", "zero3", "fsdp", "ddp")


@dataclass(frozen=True)
class Configuration:
    """One candidate: strategy and ZeRO stage, CPU offload, checkpointing, attention kernel."""

    strategy: str
    offload: str = "none"
    gradient_checkpointing: bool = False
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise PlannerError(f"unknown strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}",
                               "strategy")
        if self.offload not in OFFLOADS_BY_STRATEGY[self.strategy]:
            raise PlannerError(f"{self.strategy} cannot offload {self.offload!r}: it offers "
                               f"{', '.join(OFFLOADS_BY_STRATEGY[self.strategy])}", "offload")
        if self.attention not in ATTENTIONS:
            raise PlannerError(f"unknown attention {self.attention!r}: use one of "
                               f"{', '.join(ATTENTIONS)}", "attention")

    def describe(self) -> str:
        """A short label, e.g. 'zero3 + offload optimizer + gradient checkpointing + sdpa'."""
        parts = [self.strategy]
        if self.offload != "none":
            parts.append(f"offload {self.offload}")
        if self.gradient_checkpointing:
            parts.append("gradient checkpointing")
        parts.append(self.attention)
        return " + ".join(parts)


@dataclass(frozen=True)
class Overheads:
    """Term C of the study ("temporary buffers and fragmentation"), which its Table 1 leaves out.

    Every number is a default a deployment may tune; the planner reports their sum as `overhead`.
    """

    cuda_context_gb: float = 0.5
    """CUDA context, cuBLAS and NCCL workspaces, GB (10^9 bytes) per GPU."""
    loss_chunk_bytes: float = 4.0
    """Bytes per (token, vocabulary entry) of the one chunk the loss works on at a time, with
    16-bit logits: its fp32 copy (fp32 logits are worked on in their gradient's buffer)."""
    zero_bucket_elements: float = 5e8
    """DeepSpeed ZeRO-1/2 reduce and all-gather bucket size (its default), 16-bit elements."""
    zero3_prefetch_elements: float = 5e7
    """DeepSpeed ZeRO-3 prefetch bucket (its default), gathered on top of the module in use."""
    allocator_reserve: float = 0.2
    """The caching allocator's reserved peak over its allocated one, as a fraction of what comes
    and goes every step (activations, gradients, buffers, temporaries: parameters and optimizer
    states are allocated once, in blocks it fills): sizes rounded up and fragments between them.
    At 0.2 PEFT's MetaMathQA reserved peak is planned at 1.07, and the study's Figure 4 runs still
    fit their 32 GB V100s."""
    nccl_gb: float = 1.0
    """NCCL's buffers per GPU when a job has several, GB: about 1.06 GB per GPU measured after
    the first collectives on 8 H100s over NVLink (NVIDIA/nccl#1685); it grows with channels, not
    with the model."""


@dataclass(frozen=True)
class PlanSpec:
    """A planning question. Memory is in GB of 10^9 bytes, the study's unit."""

    architecture: Architecture
    method: str = "lora"
    """full, lora or qlora."""
    lora_r: int = 8
    lora_targets: str | tuple[str, ...] = "all-linear"
    double_quant: bool = True
    """QLoRA: quantize the quantization constants too (bitsandbytes' double quantization)."""
    seq_len: int = 512
    """s: tokens per sequence (the padded length, as in the study)."""
    micro_batch: int = 1
    """b: sequences per forward pass per GPU."""
    gpus: int = 1
    """N: GPUs the job trains on (data-parallel world size)."""
    gpu_memory_gb: float = 80.0
    """Memory of one GPU that the job may use, GB."""
    gpu_type: str | None = None
    """e.g. "V100", "A100", "H100"; decides whether flash_attention_2 is a candidate."""
    strategies: tuple[str, ...] = STRATEGIES
    """Strategies to consider; one when the job forces it."""
    attentions: tuple[str, ...] = ("sdpa", "flash_attention_2")
    """Attention kernels to consider. eager is left out by default: the model gives it sdpa's
    memory and more time, so it never wins."""
    offloads: tuple[str, ...] = OFFLOADS
    """CPU offloads to consider, e.g. ("none",) where host memory is short."""
    gradient_checkpointing: tuple[bool, ...] = (False, True)
    precision: str = "bf16"
    """Compute precision: bf16 or fp16 (mixed precision), or fp32 (every CPU job)."""
    device: str = "cuda"
    """cuda, or cpu for CPU workers (no CUDA context; dropout keeps a full-size noise tensor)."""
    lora_dropout: float = 0.0
    """LoRA dropout: above 0 every adapted linear keeps its own dropout mask and output."""
    gradient_accumulation: bool = True
    """Whether micro-batches accumulate gradients (the gradients then live through the forward);
    False when every step is one micro-batch per worker."""
    reference_copy: bool = False
    """Preference tuning (DPO) of every weight: a frozen, unsharded copy of the base model in the
    compute precision lives on each device as the reference. (LoRA's reference is the base itself,
    the adapter switched off: no copy.)"""
    overheads: Overheads = field(default_factory=Overheads)

    def __post_init__(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(("method", f"unknown method {self.method!r}: use full, lora or qlora"))
        for name in ("lora_r", "seq_len", "micro_batch", "gpus"):
            if getattr(self, name) < 1:
                problems.append((name, f"{name} must be at least 1, got {getattr(self, name)}"))
        if not self.gpu_memory_gb > 0:
            problems.append(("gpu_memory_gb",
                             f"gpu_memory_gb must be positive, got {self.gpu_memory_gb}"))
        if not self.strategies or any(s not in STRATEGIES for s in self.strategies):
            problems.append(("strategies", f"strategies {list(self.strategies)} must be some of "
                             f"{', '.join(STRATEGIES)}"))
        if not self.offloads or any(o not in OFFLOADS for o in self.offloads):
            problems.append(("offloads", "offloads must be one or more of "
                             f"{', '.join(OFFLOADS)}"))
        if not self.attentions or any(a not in ATTENTIONS for a in self.attentions):
            problems.append(("attentions", f"attentions must be some of {', '.join(ATTENTIONS)}"))
        if self.precision not in PRECISIONS:
            problems.append(("precision", f"precision must be one of {', '.join(PRECISIONS)}"))
        if self.device not in DEVICES:
            problems.append(("device", f"device must be one of {', '.join(DEVICES)}"))
        if not 0 <= self.lora_dropout < 1:
            problems.append(("lora_dropout", f"lora_dropout must be in [0, 1), got {self.lora_dropout}"))
        if problems:
            # Report the first; each message names its field.
            param, message = problems[0]
            raise PlannerError("; ".join(m for _, m in problems), param)
        if self.method != "full":
            self.trainable_parameters  # noqa: B018 - raises PlannerError for unknown LoRA targets

    @classmethod
    def from_request(cls, request: Any, cluster: Any, architecture: Architecture) -> PlanSpec:
        """The question a job request (`api.models.JobCreate` or `PlanRequest`) asks on `cluster`
        (`api.models.Cluster`), read by attribute so the planner needs no wire-model import.
        A forced strategy is the only one weighed; "auto" weighs all. Raises PlannerError."""
        method, hp = getattr(request, "tuning", request.method), request.hyperparameters
        # A DPO pair is two sequences (the preferred and the non-preferred conversation) per forward.
        dpo = getattr(request, "objective", "sft") == "dpo"
        lora: dict[str, Any] = {}
        if method.type != "full":
            targets = method.target_modules
            lora = {"lora_r": method.r, "lora_dropout": method.dropout,
                    "lora_targets": targets if isinstance(targets, str) else tuple(targets)}
        if method.type == "qlora":
            lora["double_quant"] = method.double_quant
        strategies = STRATEGIES if request.strategy == "auto" else (request.strategy,)
        precision = request.optimizations.precision
        # the fewest workers the job may run with accumulate the most
        fewest = min(cluster.gpus, request.scaling.min_workers)
        return cls(architecture, method=method.type, seq_len=hp.max_seq_len,
                   micro_batch=hp.micro_batch_size * (2 if dpo else 1), gpus=cluster.gpus,
                   reference_copy=dpo and method.type == "full",
                   precision="bf16" if precision == "auto" else precision,
                   gradient_accumulation=hp.global_batch_size > hp.micro_batch_size * fewest,
                   gpu_memory_gb=cluster.gpu_memory_gb, gpu_type=cluster.gpu_type,
                   strategies=strategies, **lora)

    @property
    def trainable_parameters(self) -> int:
        """φ: θ for full fine-tuning, the adapter parameters for LoRA and QLoRA."""
        if self.method == "full":
            return self.architecture.parameters
        return self.architecture.lora_parameters(self.lora_r, self.lora_targets)
