"""Load a base model through `from_pretrained` and make it trainable: LoRA, QLoRA or full."""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

import torch

from eft.training.attention import VARLEN_NAMES, register as register_varlen_attention
from eft.training.config import LoraSpec, TrainConfig
from eft.training.lora import fuse_lora_updates


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(cfg: TrainConfig) -> torch.dtype:
    """The dtype the forward pass computes in (the job's `precision`)."""
    return DTYPES[cfg.precision]


def _quantization_config(cfg: TrainConfig) -> Any:
    from transformers import BitsAndBytesConfig

    assert cfg.lora is not None
    if cfg.lora.quant_bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=cfg.lora.quant_type or "nf4",
        bnb_4bit_use_double_quant=cfg.lora.double_quant,
        bnb_4bit_compute_dtype=compute_dtype(cfg),
    )


def base_weight_dtype(cfg: TrainConfig) -> torch.dtype:
    """The dtype the base model's weights are loaded in.

    LoRA under DDP with 16-bit precision keeps the frozen base weights in the compute dtype (2
    bytes each, as the planner counts them) and the adapters in fp32 (PEFT upcasts them: they
    are the optimizer's master weights). Elsewhere weights load in fp32: full fine-tuning's
    master copy, FSDP's flat parameters (one dtype per unit; its mixed-precision policy casts
    for compute), DeepSpeed (its bf16/fp16 mode casts the module itself), QLoRA (PEFT's k-bit
    preparation upcasts the unquantized weights) and fp32 jobs.
    """
    if cfg.method == "lora" and cfg.strategy == "ddp" and cfg.precision in ("bf16", "fp16"):
        return compute_dtype(cfg)
    return torch.float32


#: What a worker fetches of a hub model: weights (safetensors), config, tokenizer, template.
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.*"]


def pretrained_path(cfg: TrainConfig) -> str:
    """The local directory the base model and tokenizer load from. A hub model is fetched at its
    pinned revision into the Hugging Face cache (once per node: later calls find it there)."""
    return hub_path(cfg.hub) if cfg.hub else cfg.model_path


def hub_path(hub: dict[str, Any]) -> str:
    """The local snapshot of a pinned hub model ({"repo_id", "revision", "cache_dir",
    "local_files_only"}), fetched once per process."""
    return _hub_snapshot(hub["repo_id"], hub["revision"], hub.get("cache_dir"), bool(hub.get("local_files_only")),
                         bool(hub.get("use_token", True)), hub.get("endpoint"))


@functools.lru_cache(maxsize=4)
def _hub_snapshot(repo_id: str, revision: str, cache_dir: str | None, local_files_only: bool,
                  use_token: bool = True, endpoint: str | None = None) -> str:
    """One fetch per process for the tokenizer and the model alike: with the node's token
    (HF_TOKEN) only where the service said the job's tenant may read the repository with it."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only,
                             allow_patterns=HUB_FILES, token=None if use_token else False, endpoint=endpoint)


def peft_target_modules(spec: LoraSpec) -> str | list[str]:
    """PEFT's `target_modules` for `spec`: the names, or within `module_scope` a pattern that
    matches those names inside that module only (PEFT full-matches a string against each module's
    path)."""
    target = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    if spec.module_scope is None:
        return target
    if isinstance(target, str):
        raise ValueError(f"a scoped LoRA target must name its modules, got {target!r}")
    names = "|".join(re.escape(name) for name in target)
    return rf"{re.escape(spec.module_scope)}\..*\.(?:{names})"


def skip_unused_quantization(cfg: TrainConfig) -> None:
    """Keep bitsandbytes out of a process that trains no quantized model. PEFT imports it
    whenever it is installed (about 3 s of a job's start, on every worker); marking it absent
    in `sys.modules` makes PEFT's and transformers' availability checks say so. Call before
    PEFT is imported; a QLoRA job leaves it alone."""
    if cfg.method != "qlora":
        sys.modules.setdefault("bitsandbytes", None)  # type: ignore[arg-type]


def load_trainable_model(cfg: TrainConfig) -> torch.nn.Module:
    """Returns the base model with the job's method applied; only trainable params need grads."""
    from transformers import AutoModelForCausalLM

    attention = cfg.attention
    if cfg.packing and attention in VARLEN_NAMES:
        # Packed micro-batches attend per example (training/attention.py); padded batches
        # (evaluation) take the stock kernel through the same name.
        register_varlen_attention()
        attention = VARLEN_NAMES[attention]
    kwargs: dict[str, Any] = {"dtype": base_weight_dtype(cfg), "attn_implementation": attention}
    if cfg.method == "qlora":
        kwargs["quantization_config"] = _quantization_config(cfg)
    model = AutoModelForCausalLM.from_pretrained(pretrained_path(cfg), **kwargs)
    if cfg.gradient_checkpointing:
        # Non-reentrant checkpointing needs no input grads, so frozen embeddings are fine.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.method == "full":
        model.requires_grad_(True)
        return model

    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.method == "qlora":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=cfg.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    spec = cfg.lora
    assert spec is not None
    lora_config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=peft_target_modules(spec),
        task_type="CAUSAL_LM",
    )
    # Seeded so every rank builds identical adapters (DDP also broadcasts rank 0's at wrap).
    torch.manual_seed(cfg.seed)
    model = get_peft_model(model, lora_config)
    fuse_lora_updates(model, cfg.strategy)  # training/lora.py: one addmm for each layer's update
    return model


def load_reference_model(cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """DPO's frozen reference for full fine-tuning: the base model again, in the compute dtype,
    whole on this device, without gradients (LoRA and QLoRA switch their adapter off instead)."""
    from transformers import AutoModelForCausalLM

    attention = cfg.attention
    if cfg.packing and attention in VARLEN_NAMES:
        register_varlen_attention()
        attention = VARLEN_NAMES[attention]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision, torch.float32)
    model = AutoModelForCausalLM.from_pretrained(pretrained_path(cfg), dtype=dtype, attn_implementation=attention)
    model.requires_grad_(False)
    return model.to(device).eval()


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name, detached and on CPU (what a checkpoint keeps)."""
    return {
        name: p.detach().to("cpu").contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable parameters into `model`. Raises KeyError on a name mismatch."""
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in state]
    if missing:
        raise KeyError(f"checkpoint lacks trainable parameters: {missing[:5]}")
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
