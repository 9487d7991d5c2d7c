"""Where the fused LoRA forward (`training/lora.py`) applies, and where PEFT's own stays."""

from __future__ import annotations


import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from eft.training.lora import FUSED_STRATEGIES, FusedLora, fuse_lora_updates
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"


def _peft(**lora) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM", **lora))


def _variants(model: torch.nn.Module) -> list[object]:
    return [v for m in model.modules() for v in getattr(m, "lora_variant", {}).values()]


def test_every_vanilla_lora_linear_is_fused_under_the_whole_parameter_strategies():
    for strategy in sorted(FUSED_STRATEGIES):
        model = _peft()
        fused = fuse_lora_updates(model, strategy)
        assert fused > 0 and len(_variants(model)) == fused
        assert all(isinstance(v, FusedLora) for v in _variants(model))


def test_zero3_dora_and_a_bias_keep_pefts_forward():
    # ZeRO-3 gathers a module's parameters in hooks on its own forward, which the fused one skips.
    model = _peft()
    assert fuse_lora_updates(model, "zero3") == 0 and not _variants(model)
    dora = _peft(use_dora=True)
    assert fuse_lora_updates(dora, "ddp") == 0
    assert _variants(dora) and not any(isinstance(v, FusedLora) for v in _variants(dora))
    biased = _peft(lora_bias=True)
    assert fuse_lora_updates(biased, "ddp") == 0 and not _variants(biased)
