"""Training configuration: frozen dataclasses that cross from the service into the Ray Job
driver and the Train workers as plain dicts. Pure Python: no torch import here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoraSpec:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = "all-linear"
    #: Module path the adapters are confined to: the text model of a multimodal checkpoint
    #: (e.g. "model.language_model"), so the vision tower and the projector stay untouched.
    module_scope: str | None = None
    #: 4-bit data type for QLoRA ("nf4" or "fp4"); None loads the base model unquantized.
    quant_type: str | None = None
    double_quant: bool = True
    #: Bits of the quantized base weights: 4 (QLoRA) or 8 (LLM.int8()).
    quant_bits: int = 4


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs, with every default already filled in."""

    job_id: str
    model_path: str
    training_file: str
    validation_file: str | None
    method: str  # "lora" | "qlora" | "full"
    lora: LoraSpec | None
    total_steps: int
    num_train_examples: int  # preference pairs, for a DPO job
    #: "sft" (next-token loss on the trained tokens) or "dpo" (preference pairs, training/preference.py).
    objective: str = "sft"
    dpo_beta: float = 0.1
    learning_rate: float = 2e-4
    lr_scheduler: str = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    global_batch_size: int = 8
    micro_batch_size: int = 4
    max_seq_len: int = 512
    #: Chat records: train on "assistant" turns, the "last_assistant" turn, or "all" tokens.
    train_on: str = "assistant"
    #: Chat records: "keep" the system message or "fold" it into the first user turn.
    system_message: str = "keep"
    #: Canonical record field -> the dataset column it is read from.
    data_columns: dict[str, str] = dataclasses.field(default_factory=dict)
    seed: int = 42
    log_every_steps: int = 1
    min_workers: int = 1
    max_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    #: Extra Ray resources per worker (e.g. {"spot": 1} to place workers on spot nodes only).
    resources_per_worker: dict[str, float] = dataclasses.field(default_factory=dict)
    #: The GPU type (Ray's accelerator type) the workers are placed on, as the cluster scheduler
    #: chose it; None: any.
    accelerator_type: str | None = None
    strategy: str = "ddp"
    checkpoint_every_steps: int = 50
    #: Validation loss every this many steps (0: only at the end); early stopping after this
    #: many evaluations without a decrease of more than the min delta (0: never).
    eval_every_steps: int = 0
    early_stopping_patience: int = 0
    early_stopping_min_delta: float = 0.0
    #: Greedy replies to the first validation prompts at each evaluation (0: none).
    eval_sample_prompts: int = 0
    eval_sample_tokens: int = 48
    #: The artifact's weights: "last" step's, or the "best" evaluation's.
    publish: str = "last"
    checkpoint_keep: int = 2
    #: Also checkpoint when this many seconds have passed since the last one (None: steps only).
    checkpoint_every_seconds: float | None = None
    #: Restarts after platform failures (worker or node lost); preemptions are not counted.
    max_restarts: int = 3
    #: A Hugging Face hub model: {"repo_id", "revision" (pinned commit), "cache_dir",
    #: "local_files_only"}; the
    #: workers load it from there instead of `model_path` (the service's config-only snapshot).
    hub: dict[str, Any] | None = None
    checkpoint_root: str = ""
    artifact_root: str = ""
    base_model_name: str = ""
    #: Memory optimizations (see the optimization study): recompute activations in backward,
    #: the compute precision, the attention kernel, and what ZeRO / FSDP offload to CPU.
    gradient_checkpointing: bool = False
    precision: str = "fp32"  # "fp32" | "bf16" | "fp16"
    attention: str = "sdpa"  # "sdpa" | "eager" | "flash_attention_2"
    offload: str = "none"  # "none" | "optimizer" | "optimizer+params"
    #: Pack examples into full rows (no padding between them, no attention across them).
    packing: bool = True
    #: Where tokenised datasets are cached by content hash ("" disables the cache).
    data_cache_dir: str = ""
    #: Compile the model's forward and backward with torch.compile.
    compile: bool = False
    #: The planner's predicted peak memory per worker in GB, when it made one.
    predicted_memory_gb: float | None = None
    #: Continue from another job's checkpoint (a path or URI), written at `init_step` by job
    #: `init_job`: with its optimizer state (the run goes on from `init_step`), or its weights only.
    init_from: str | None = None
    init_optimizer: bool = True
    init_job: str | None = None
    init_step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        data = dict(data)
        lora = data.get("lora")
        if lora is not None:
            lora = dict(lora)
            if isinstance(lora.get("target_modules"), list):
                lora["target_modules"] = tuple(lora["target_modules"])
            data["lora"] = LoraSpec(**lora)
        return cls(**data)


def steps_for(num_examples: int, global_batch_size: int, epochs: float) -> int:
    """Optimizer steps that cover `epochs` passes when the sample stream is cut into global
    batches with no example dropped (the last batch of an epoch borrows from the next)."""
    return max(1, math.ceil(epochs * num_examples / global_batch_size))
