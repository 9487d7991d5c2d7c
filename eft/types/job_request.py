"""The job request (`POST /jobs`): what a request may say, with its defaults and limits. Unknown
fields are refused, so a typo never silently falls back to a default. Pydantic only."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from eft.types._base import _Request
from eft.types.text import BoundedObject, Label, Metadata


class LoraMethod(_Request):
    """Low-rank adapters on the chosen linear layers; the base model stays frozen."""

    type: Literal["lora"] = "lora"
    r: int = Field(8, ge=1, le=1024, description="Rank of the LoRA update matrices.")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Dropout on the LoRA input. 0 by default: dropout makes every adapted linear keep a "
                    "noise mask and a second copy of its input (15-28% of a step's time, and memory); "
                    "0.05-0.1 can help small datasets over several epochs.")
    target_modules: list[str] | Literal["all-linear", "attention", "attention+mlp"] = Field(
        "all-linear",
        description="Module names to adapt, as the model names them (e.g. ['q_proj', 'v_proj'] on "
        "Llama, ['qkv_proj'] on Phi-3, ['c_attn'] on GPT-2), or a preset: 'all-linear' (every "
        "linear of the decoder layers), 'attention' (the attention projections), 'attention+mlp'.",
    )


class QloraMethod(LoraMethod):
    """LoRA on a base model loaded in 4 bits through bitsandbytes."""

    type: Literal["qlora"] = "qlora"  # type: ignore[assignment]
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type.")
    double_quant: bool = Field(True, description="Quantize the quantization constants too.")
    bits: Literal[4, 8] = Field(4, description="4 (QLoRA, NF4/FP4) or 8 (LLM.int8()) base weights.")


class FullMethod(_Request):
    """Every parameter of the base model is trained."""

    type: Literal["full"] = "full"


Tuning = Annotated[LoraMethod | QloraMethod | FullMethod, Field(discriminator="type")]


class DpoMethod(_Request):
    """Preference tuning (Direct Preference Optimization) on pairs of a preferred and a
    non-preferred reply; `tuning` says which weights change, as for supervised tuning."""

    type: Literal["dpo"] = "dpo"
    beta: float = Field(
        0.1, gt=0, le=10,
        description="How strongly the model is held to the reference (the base model): higher stays "
        "closer. 0.1 as in TRL and the DPO paper.")
    tuning: Tuning = Field(
        default_factory=LoraMethod,
        description="The weights trained: LoRA (default), QLoRA or full, with their settings. The reference "
        "model of LoRA and QLoRA is the base with the adapter switched off (no second copy); full "
        "fine-tuning keeps a frozen copy of the base (the planner counts it).")


Method = Annotated[LoraMethod | QloraMethod | FullMethod | DpoMethod, Field(discriminator="type")]


def tuning_of(method: Any) -> Any:
    """The weights a method trains: the method itself, or a DPO method's `tuning`."""
    return method.tuning if isinstance(method, DpoMethod) else method


def objective_of(method: Any) -> str:
    """"dpo" for preference tuning, else "sft" (supervised)."""
    return "dpo" if isinstance(method, DpoMethod) else "sft"


class Hyperparameters(_Request):
    epochs: float | None = Field(
        None, gt=0, le=1000, description="Passes over the training set; ignored when max_steps is set."
    )
    max_steps: int | None = Field(None, ge=1, le=10_000_000, description="Optimizer steps to run.")
    learning_rate: float = Field(2e-4, gt=0, le=1.0, description="Peak learning rate.")
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0, le=10_000_000, description="Linear warmup, in optimizer steps.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping; null disables.")
    global_batch_size: int = Field(
        8, ge=1, le=65536, description="Examples per optimizer step, whatever the worker count."
    )
    micro_batch_size: int = Field(4, ge=1, le=4096, description="Examples per forward pass.")
    max_seq_len: int = Field(512, ge=8, le=1_048_576, description="Longer examples are truncated.")
    seed: int = Field(42, ge=0, le=2**31 - 1)
    log_every_steps: int = Field(1, ge=1, le=10_000_000, description=(
        "A metrics row every this many steps (each over the steps since the one before). Rows are "
        "read off the accelerator together, about once a second of training, so a row per step "
        "costs the step nothing."))

    # Field validators (not a model validator) so these run, and are reported, even when
    # other fields of the same object are invalid.
    @field_validator("micro_batch_size")
    @classmethod
    def _micro_within_global(cls, value: int, info: ValidationInfo) -> int:
        global_batch = info.data.get("global_batch_size")
        if global_batch is not None and value > global_batch:
            raise ValueError(
                f"micro_batch_size ({value}) must not exceed global_batch_size ({global_batch}): "
                "lower micro_batch_size or raise global_batch_size"
            )
        return value


class Scaling(_Request):
    min_workers: int = Field(1, ge=1, le=4096, description="Fewest training workers to run with.")
    max_workers: int | None = Field(
        None, ge=1, le=4096, description="Most workers to grow to; defaults to min_workers."
    )
    use_gpu: bool = Field(False, description="One GPU per worker when true.")
    cpus_per_worker: float = Field(1.0, gt=0, le=512)
    resources: dict[str, float] = Field(
        default_factory=dict, max_length=16,
        description="Extra Ray resources each worker needs, e.g. {\"spot\": 1} to run only on "
        "nodes that advertise a `spot` resource.",
    )

    @field_validator("resources")
    @classmethod
    def _custom_resources_only(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory") or not name or len(name) > 64:
                raise ValueError(
                    f"resource name {name!r} is not a custom resource: use cpus_per_worker and "
                    "use_gpu for CPU and GPU, and a name of 1 to 64 characters otherwise"
                )
            if not 0 < amount <= 1e6:
                raise ValueError(f"resource {name!r} needs an amount in (0, 1e6], got {amount}")
        return value

    @field_validator("max_workers")
    @classmethod
    def _max_not_below_min(cls, value: int | None, info: ValidationInfo) -> int | None:
        low = info.data.get("min_workers")
        if value is not None and low is not None and low > value:
            raise ValueError(
                f"min_workers ({low}) exceeds max_workers ({value}): "
                "lower min_workers or raise max_workers"
            )
        return value

    @property
    def resolved_max_workers(self) -> int:
        return self.max_workers if self.max_workers is not None else self.min_workers


class CheckpointPolicy(_Request):
    every_steps: int = Field(50, ge=1, le=10_000_000, description="Save a checkpoint every this many steps.")
    keep: int = Field(2, ge=1, le=100, description="How many recent checkpoints to retain.")
    every_seconds: float | None = Field(
        None, ge=10, le=86_400,
        description="Also save when this many seconds have passed since the last checkpoint.",
    )


class Evaluation(_Request):
    """Validation during training (needs `validation_file`): the loss on the validation set every
    `every_steps` and at the end, replies to a few of its prompts, and early stopping."""

    every_steps: int | None = Field(
        None, ge=1, le=10_000_000, description="Compute the validation loss every this many steps (default: at each "
        "interval checkpoint, `checkpoint.every_steps`), and always at the end.")
    early_stopping_patience: int | None = Field(
        None, ge=1, le=1000, description="Stop once this many evaluations in a row did not lower the best "
        "validation loss by more than `min_delta`; the job then finishes and publishes as usual.")
    min_delta: float = Field(0.0, ge=0.0, description="The least decrease of the validation loss that counts.")
    sample_prompts: int = Field(
        3, ge=0, le=8, description="At each evaluation, reply greedily to this many prompts of the validation "
        "set (its first records), stored as `eval_samples` events; 0 turns it off.")
    sample_max_tokens: int = Field(48, ge=1, le=512, description="Tokens of each of those replies.")


class Recovery(_Request):
    """What the job rides out. Node preemptions (a drained or reclaimed spot node) always resume
    from a checkpoint taken when the notice arrives; other platform failures (a worker or node
    lost, the job's driver gone) restart from the latest checkpoint up to `max_restarts` times.
    User errors (bad data, a NaN loss, out of memory) fail at once."""

    max_restarts: int = Field(3, ge=0, le=100, description="Restarts after platform failures.")


Strategy = Literal["auto", "ddp", "fsdp", "zero1", "zero2", "zero3"]


class Optimizations(_Request):
    """Memory and speed options from the optimization study. "auto" (or null) leaves the
    choice to the planner, which picks the fastest configuration predicted to fit."""

    gradient_checkpointing: bool | None = Field(
        None, description="Recompute activations in backward: less memory, ~a third more compute."
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="Compute precision: auto is bf16 on GPUs, fp32 on CPU. fp16 uses loss scaling."
    )
    attention: Literal["auto", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="Attention kernel; flash_attention_2 needs flash-attn and an Ampere+ GPU."
    )
    offload: Literal["auto", "none", "optimizer", "optimizer+params"] = Field(
        "auto", description="Move optimizer state (and, with zero3/fsdp, parameters) to CPU memory."
    )
    packing: bool | None = Field(
        None, description="Pack examples into full max_seq_len rows with no attention across them: "
        "no compute spent on padding, same loss. false pads each micro-batch instead; null (auto) "
        "packs on every architecture where packing is exact (not OPT or Bloom, whose positions "
        "come from the attention mask)."
    )
    compile: bool = Field(
        False, description="torch.compile the model: faster steps after a one-off compile at start."
    )


#: Record fields a dataset column may be mapped to (`data.columns`).
RECORD_FIELDS = ("messages", "tools", "prompt", "completion", "text", "label", "instruction", "input",
                 "output", "system", "conversations")


class DataOptions(_Request):
    """What a job trains on, and how records meet the model's chat template."""

    train_on: Literal["assistant", "last_assistant", "all"] = Field(
        "assistant", description="Chat records: the loss is on every assistant turn (a turn with "
        "\"weight\": 0 is skipped), on the last assistant turn only, or on every token."
    )
    system_message: Literal["keep", "fold"] = Field(
        "keep", description="Chat records: pass a system message to the chat template, or fold it "
        "into the first user turn (for templates with no system role, such as Gemma 2's)."
    )
    columns: dict[str, str] = Field(
        default_factory=dict, max_length=16, description="Where a record's fields come from in "
        "a dataset with other column names: {\"prompt\": \"question\", \"completion\": \"answer\"} "
        "reads the prompt from the column question. Fields: messages, tools, prompt, completion, "
        "text, label, instruction, input, output, conversations."
    )
    max_dropped_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="Records with no trained token within max_seq_len are "
        "left out with a warning; the job is refused when more than this share of them would be."
    )

    @field_validator("columns")
    @classmethod
    def _known_fields(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(RECORD_FIELDS))
        if unknown:
            raise ValueError(f"unknown record field(s) {', '.join(unknown)}: map columns to "
                             f"{', '.join(RECORD_FIELDS)}")
        return value


class Trackers(_Request):
    """Experiment trackers the job also logs its step metrics to."""

    tensorboard: bool = Field(
        False, description="Write TensorBoard event files; they land in the artifact's tensorboard/ "
        "folder (and under <artifact root>/<job id>.tensorboard while the job runs)."
    )
    mlflow: bool = Field(
        False, description="Log to MLflow at the service's EFT_MLFLOW_TRACKING_URI (default: a file "
        "store under the service's home), one run per attempt named after the job."
    )


class JobCreate(_Request):
    """A fine-tuning request. Only `model` and `training_file` are required."""

    model: str = Field(
        ...,
        min_length=1,
        max_length=512,
        description="A bundled model name (e.g. 'tiny-llama'), a model directory under an allowed "
        "model root, or a Hugging Face id when the server allows hub models.",
    )
    training_file: str = Field(
        ..., min_length=1, max_length=2048, description="JSONL path under an allowed data root."
    )
    validation_file: str | None = Field(None, min_length=1, max_length=2048)
    method: Method = Field(default_factory=LoraMethod)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    scaling: Scaling = Field(default_factory=Scaling)
    strategy: Strategy = "auto"
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    eval: Evaluation = Field(default_factory=Evaluation)
    publish: Literal["last", "best"] = Field(
        "last", description="The weights the artifact holds: those of the last step, or of the evaluation "
        "with the lowest validation loss (needs `validation_file`; LoRA and QLoRA).")
    recovery: Recovery = Field(default_factory=Recovery)
    optimizations: Optimizations = Field(default_factory=Optimizations)
    trackers: Trackers = Field(default_factory=Trackers)
    data: DataOptions = Field(default_factory=DataOptions)
    name: Label | None = Field(None, max_length=200)
    metadata: Metadata = Field(default_factory=dict, max_length=32)
    integrations: list[BoundedObject] = Field(
        default_factory=list, max_length=5,
        description="OpenAI-style integrations (e.g. {\"type\": \"wandb\", \"wandb\": {\"project\": ...}}), "
        "recorded with the job as sent (/v1 creates fill it).")
    from_checkpoint: str | None = Field(
        None, min_length=1, max_length=512,
        description="Continue training from another of your jobs: `<job id>:<step>` (a kept checkpoint), "
        "`<job id>` (its latest), or a checkpoint's model id (`ft:...:ckpt-<step>`). A fine-tuned model id as "
        "`model` does the same from that job's latest checkpoint. The base model and the adapter's shape come "
        "from that job; see `restore_optimizer`.")
    restore_optimizer: bool = Field(
        True, description="With `from_checkpoint`: true continues that run (its optimizer state, step count, "
        "learning-rate schedule and place in the data: `max_steps` or `epochs` are the steps added, so the "
        "result equals one run of all the steps); false starts a new run from its weights only.")
    webhook_url: str | None = Field(
        None, min_length=8, max_length=2048,
        description="Where this job's succeeded, failed, cancelled and paused events are sent, signed with the "
        "tenant's webhook secret (POST /webhooks/secret makes it): an https URL.")
    priority: str | int = Field(
        "normal", description="Order among the tenant's own queued jobs: low (0), normal (50), high (100) or a "
        "number 0-100; higher runs first. Tenants share the cluster by their weights whatever their jobs' priority.")

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if (isinstance(value, str) and value in ("low", "normal", "high")) or (
                isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100):
            return value
        raise ValueError(f"priority is low, normal, high or a number from 0 to 100, not {value!r}")

    @property
    def tuning(self) -> LoraMethod | QloraMethod | FullMethod:
        return tuning_of(self.method)

    @property
    def objective(self) -> str:
        return objective_of(self.method)
