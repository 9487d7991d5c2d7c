"""LoRA's forward with its update fused into one matrix product.

PEFT's `lora.Linear` computes ``result + lora_B(lora_A(dropout(x))) * scaling``: after the base
layer's product, two passes over the full ``[tokens, out_features]`` output (the scaling and the
sum) and, in the backward, a third (the scaling's gradient). For LoRA on every linear layer those
passes are a measurable share of a step (memory-bound work as large as the layer's output, for a
rank-8 product that costs almost nothing). Here the scaling goes on the rank-sized activation
instead, and the sum into the product itself::

    addmm(result, lora_A(dropout(x)) * scaling, lora_B.weight.T)

the same mathematics (a BLAS ``C + A @ B``), so the adapter, its gradients and its saved form are
PEFT's own. It runs through PEFT's hook for LoRA variants (`LoraVariant`, the mechanism DoRA uses),
on plain `lora.Linear` layers with vanilla LoRA only: a layer with another variant (DoRA), a
bias on `lora_B`, a quantised base (QLoRA's bitsandbytes layers are other classes) keeps PEFT's
forward. Merging and unmerging are PEFT's vanilla arithmetic.

Not under ZeRO-3: there a module's parameters are gathered by hooks on its own forward, and this
reads `lora_B.weight` without calling `lora_B`.
"""

from __future__ import annotations

from typing import Any

import torch

#: Strategies whose parameters are whole in the forward pass (ZeRO-3 partitions them).
FUSED_STRATEGIES = frozenset({"ddp", "fsdp", "zero1", "zero2"})


class FusedLora:
    """Vanilla LoRA with the update summed into the output by one `addmm`: PEFT's `LoraVariant`
    interface (PEFT calls these methods; this module does not import PEFT, so that loading it
    imports nothing a CPU job leaves out, bitsandbytes included)."""

    def supports_lora_conversion(self) -> bool:
        return True

    @staticmethod
    def init(module: Any, adapter_name: str, **kwargs: Any) -> None:
        pass

    @staticmethod
    def merge_safe(module: Any, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return orig_weight + module.get_delta_weight(active_adapter).to(orig_weight.dtype)

    @staticmethod
    def merge_unsafe(module: Any, active_adapter: str, orig_weight: torch.Tensor) -> None:
        orig_weight.data += module.get_delta_weight(active_adapter).to(orig_weight.dtype)

    @staticmethod
    def unmerge(module: Any, active_adapter: str, orig_weight: torch.Tensor) -> torch.Tensor:
        return orig_weight.data - module.get_delta_weight(active_adapter).to(orig_weight.dtype)

    @staticmethod
    def forward(module: Any, active_adapter: str, x: torch.Tensor, result: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        lora_a, lora_b = module.lora_A[active_adapter], module.lora_B[active_adapter]
        low = lora_a(module.lora_dropout[active_adapter](x)) * module.scaling[active_adapter]
        out = torch.addmm(result.reshape(-1, result.shape[-1]), low.reshape(-1, low.shape[-1]), lora_b.weight.t())
        return out.view(result.shape)


def fuse_lora_updates(model: torch.nn.Module, strategy: str) -> int:
    """Give every plain vanilla-LoRA linear layer of `model` the fused forward; returns how many
    adapters it fused. Nothing changes under ZeRO-3 or with a PEFT that has no variant hook."""
    if strategy not in FUSED_STRATEGIES:
        return 0
    from peft.tuners.lora.layer import Linear

    fused = 0
    for module in model.modules():
        if type(module) is not Linear or not hasattr(module, "lora_variant"):
            continue  # another layer type, or a PEFT without the variant hook
        for name in module.lora_A:
            if name in module.lora_variant or module.lora_B[name].bias is not None:
                continue  # DoRA or another variant, or a bias on lora_B: PEFT's forward
            module.lora_variant[name] = FusedLora()
            fused += 1
    return fused


def keep_activation_dtype(model: torch.nn.Module) -> int:
    """Under autocast, LoRA layers take the activations as they come: PEFT casts a layer's input
    to its adapter's dtype first (bf16 activations to fp32 for fp32 adapters), and autocast then
    casts it back to bf16 for the adapter's matrix product, two passes over the activation in
    each direction on every adapted layer for nothing. Returns how many layers it changed. Only
    for strategies that run the forward under autocast: without it the dtypes must match."""
    changed = 0
    for module in model.modules():
        if getattr(module, "cast_input_dtype_enabled", False):
            module.cast_input_dtype_enabled = False  # PEFT's switch (`peft.helpers.disable_input_dtype_casting`)
            changed += 1
    return changed
