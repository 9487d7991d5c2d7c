"""Exact attention for packed micro-batches: each example attends to itself only, at its own cost.

A packed micro-batch is one flattened row of whole examples (`training/packing.py`), passed to the
model with the examples' boundaries as `cu_seq_lens_q` / `cu_seq_lens_k` and their longest length
as `max_length_q` / `max_length_k` — the keyword arguments transformers' models hand through to
their attention function (TRL's padding-free collator and `DataCollatorWithFlattening` pass the
same). What runs with them:

* ``flash_attention_2`` / ``_3``: flash-attention's varlen kernel over the boundaries, as
  transformers calls it. No mask, no padding, no work across examples.
* ``sdpa`` and ``eager``: the model is switched to ``eft_packed`` / ``eft_packed_eager``
  (registered here with transformers' `AttentionInterface`). They run the same kernel per
  example: causal SDPA, or the model's eager math, on each example's slice of the row. The
  alternative, a block-diagonal mask over the whole row, computes (and for eager keeps) every
  score between examples only to mask it out: with ~5 examples in a 512-token row two thirds of
  the work.

On any device other than the CPU (a GPU; the meta device, where the device path is checked
without one), ``eft_packed`` makes **one call per layer**: torch's `varlen_attn` (flash-attention's
varlen kernel, built into the CUDA wheels) over the whole row and its boundaries, copied to the
device once per micro-batch without blocking (`training/packing.py:packed_inputs`). A per-example
loop there would launch one kernel per example and layer, and SDPA's cuDNN backend (preferred on
recent CUDA builds) would build an execution graph for almost every call, since the shapes and
strides change with each example and row. The loop stays the CPU path, and the fallback where
varlen does not apply (fp32, logit soft-capping, attention dropout, head dims over 256, a torch
without it); on a GPU it never lets SDPA pick cuDNN.

Sliding-window layers (Mistral, Gemma 2/3, Phi-3) keep their window within each example; logit
soft-capping (Gemma 2) runs the eager math. Without boundaries (a padded batch, evaluation,
generation) both names fall back to the stock sdpa / eager path with its mask.

A packed row needs no mask, and transformers' mask builders, given position ids and no mask,
look for packed sequences in them on the host (a device sync per forward pass, for a mask the
kernels here would discard): `packed_inputs` passes `PACKED_ROW_MASK`, a 4-D placeholder that
the builders hand through as already prepared.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

import torch
import torch.nn.functional as F

#: The job's attention kernel -> what a packed job's model runs.
VARLEN_NAMES = {"sdpa": "eft_packed", "eager": "eft_packed_eager"}
#: Kernels that take the boundaries natively (transformers' flash-attention varlen path).
FLASH_KERNELS = frozenset({"flash_attention_2", "flash_attention_3"})
#: What a packed row passes as its attention mask: a 4-D tensor is taken by transformers' mask
#: builders as prepared and handed to the attention function unread (`_varlen` ignores it).
PACKED_ROW_MASK = torch.zeros(1, 1, 0, 0, dtype=torch.bool)


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return states
    batch, heads, length, dim = states.shape
    return states[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def _window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """Causal mask limited to the last `window` keys (transformers' `q - kv < window`)."""
    q = torch.arange(length, device=device)[:, None]
    kv = torch.arange(length, device=device)[None, :]
    return (kv <= q) & (q - kv < window)


def _segment_eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                   window: int | None, softcap: float | None, dropout: float, training: bool) -> torch.Tensor:
    """The eager math of transformers' Llama / Gemma 2 on one example: [1, H, n, D] -> same."""
    length = query.shape[2]
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    allowed = (_window_mask(length, window, query.device) if window is not None and window < length else
               torch.ones(length, length, dtype=torch.bool, device=query.device).tril())
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=training)
    return torch.matmul(weights, value)


def _segment_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                  window: int | None, dropout: float) -> torch.Tensor:
    length = query.shape[2]
    groups = query.shape[1] // key.shape[1]
    masked = window is not None and window < length
    # Grouped-query attention without repeating the key/value heads (SDPA broadcasts them), where
    # a fused kernel takes it: causal without a mask, head dims up to 256 (as transformers
    # checks). With a mask, grouped SDPA is the math kernel on CUDA (the whole score matrix).
    gqa = groups > 1 and not masked and query.shape[-1] <= 256
    if groups > 1 and not gqa:
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    if masked:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=_window_mask(length, window, query.device),
                                              dropout_p=dropout, scale=scaling)
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, dropout_p=dropout, scale=scaling,
                                          enable_gqa=gqa)


def _bounds(cu_seq_lens: torch.Tensor) -> list[int]:
    # Built on the host by the collator. On a device, `packed_inputs` copies it there and keeps
    # the host values on the copy (`host_bounds`): reading them costs no device sync.
    host = getattr(cu_seq_lens, "host_bounds", None)
    if host is not None:
        return list(host)
    if cu_seq_lens.device.type != "cpu":
        raise ValueError("packed attention reads the examples' boundaries on the host: pass them through "
                         "training.packing.packed_inputs")
    return [int(b) for b in cu_seq_lens.tolist()]


def is_packed_row_mask(mask: Any) -> bool:
    """Whether `mask` is `PACKED_ROW_MASK` (or its copy on a device)."""
    return isinstance(mask, torch.Tensor) and mask.ndim == 4 and mask.numel() == 0


@functools.cache
def _varlen_kernel() -> tuple[Any, frozenset[str]] | None:
    """torch's `varlen_attn` and the keyword arguments it takes, or None without it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def device_varlen_applies(query: torch.Tensor, window: int | None, softcap: float | None, dropout: float) -> bool:
    """Whether a packed row on this tensor's device runs as one `varlen_attn` call per layer."""
    kernel = _varlen_kernel()
    if query.device.type == "cpu" or kernel is None or softcap is not None or dropout > 0:
        return False
    if query.dtype not in (torch.float16, torch.bfloat16) or query.shape[-1] > 256:
        return False  # flash-attention's kernels: half precision, head dims up to 256
    return window is None or "window_size" in kernel[1]


def _device_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor,
                   longest: int, scaling: float, window: int | None) -> torch.Tensor:
    """One flash varlen call over the row: [1, H, T, D] (k/v: [1, KV, T, D]) -> [1, T, H, D]."""
    varlen_attn, accepts = _varlen_kernel()
    groups = query.shape[1] // key.shape[1]
    extra: dict[str, Any] = {}
    if groups > 1 and "enable_gqa" in accepts:
        extra["enable_gqa"] = True
    else:
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, heads, D]
    if "window_size" in accepts:
        # causal: (-1, 0); transformers' window keeps keys with q - kv < window
        extra["window_size"] = (-1, 0) if window is None else (window - 1, 0)
    else:
        extra["is_causal"] = True
    out = varlen_attn(q, k, v, cu_seq_lens, cu_seq_lens, longest, longest, scale=scaling, **extra)
    return out[None]


def _varlen(kernel: str, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
            sliding_window: int | None = None, softcap: float | None = None,
            cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    if cu_seq_lens_q is None:
        if is_packed_row_mask(attention_mask):
            raise ValueError("a packed row's placeholder mask came without the examples' boundaries "
                             "(cu_seq_lens_q): pass the inputs of training.packing.packed_inputs whole")
        if attention_mask is not None or query.shape[2] != key.shape[2]:  # padded, or decoding with a cache
            return _stock(kernel, module)(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, sliding_window=sliding_window, softcap=softcap, **kwargs)
        # Unpadded rows of one sequence each: one causal segment per row.
        cu_seq_lens_q = torch.tensor([0, query.shape[2]])
    elif query.shape[0] != 1:
        raise ValueError("packed attention takes one flattened row per micro-batch, "
                         f"got a batch of {query.shape[0]} rows")
    if kwargs.get("s_aux") is not None:
        raise ValueError("attention sinks are not supported by packed attention: train this model with packing off")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    eager = kernel == "eager" or softcap is not None
    if eager:
        groups = query.shape[1] // key.shape[1]
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    training = module.training
    dropout = dropout if training else 0.0
    window = sliding_window if sliding_window is not None and sliding_window < query.shape[2] else None
    if not eager and query.shape[0] == 1 and device_varlen_applies(query, window, softcap, dropout):
        longest = kwargs.get("max_length_q") or query.shape[2]
        bounds_on_device = cu_seq_lens_q.to(query.device, torch.int32, non_blocking=True)
        return _device_varlen(query, key, value, bounds_on_device, int(longest), scaling, window), None
    bounds = _bounds(cu_seq_lens_q)
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    if bounds[-1] < query.shape[2]:  # a tail outside every example (none from our collator): its own segment
        lengths.append(query.shape[2] - bounds[-1])
    # `split`, not slicing: its backward is one concatenation of the segments' gradients, where
    # each slice's backward would fill a zero tensor the size of the whole row.
    outputs = []
    with _no_cudnn(query.device):
        for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2)):
            if eager:
                outputs.append(_segment_eager(q, k, v, scaling, sliding_window, softcap, dropout, training))
            else:
                outputs.append(_segment_sdpa(q, k, v, scaling, sliding_window, dropout))
    out = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
    return out.transpose(1, 2).contiguous(), None


def _no_cudnn(device: torch.device):
    """On CUDA, SDPA without its cuDNN backend: cuDNN builds and caches an execution graph per
    exact shape and stride, and per-example shapes are new almost every call."""
    import contextlib

    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _stock(kernel: str, module: torch.nn.Module):
    """transformers' own function for `kernel`: sdpa's shared one, or the model file's eager one."""
    if kernel == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    return sys.modules[type(module).__module__].eager_attention_forward


def varlen_sdpa(module, query, key, value, attention_mask, **kwargs):
    return _varlen("sdpa", module, query, key, value, attention_mask, **kwargs)


def varlen_eager(module, query, key, value, attention_mask, **kwargs):
    return _varlen("eager", module, query, key, value, attention_mask, **kwargs)


def _mask_for(kernel: str):
    def mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
        # No 2-D mask: every token is real (packed rows, or one unpadded sequence), so the
        # attention function needs no mask at all; a padded batch gets the stock one.
        if attention_mask is None:
            return None
        from transformers.masking_utils import eager_mask, sdpa_mask

        return (sdpa_mask if kernel == "sdpa" else eager_mask)(*args, attention_mask=attention_mask, **kwargs)

    return mask


def register() -> None:
    """Make the varlen kernels known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_NAMES["sdpa"], varlen_sdpa)
    AttentionInterface.register(VARLEN_NAMES["eager"], varlen_eager)
    AttentionMaskInterface.register(VARLEN_NAMES["sdpa"], _mask_for("sdpa"))
    AttentionMaskInterface.register(VARLEN_NAMES["eager"], _mask_for("eager"))


def use_packed_attention(model: torch.nn.Module, kernel: str) -> None:
    """Switch a loaded model to the per-example kernel for `kernel` (flash-attention's already is)."""
    if kernel in FLASH_KERNELS:
        return
    register()
    model.set_attn_implementation(VARLEN_NAMES[kernel])
