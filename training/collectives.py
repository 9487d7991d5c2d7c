"""The one collective the training loop and its evaluations use: a sum (or maximum) over ranks of
host numbers and device scalars together, read back once."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_reduce_sum(values: list[Any], device: torch.device, op: str = "sum") -> list[float]:
    """All-reduce `values` (Python numbers and device scalars, in any mix) in one collective and
    read the result once: the host numbers travel in one copy to the device, the device
    scalars are never read on their own."""
    on_device = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    host = [i for i, v in enumerate(values) if not isinstance(v, torch.Tensor)]
    parts = [torch.tensor([float(values[i]) for i in host], dtype=torch.float64, device=device)]
    if on_device:
        parts.append(torch.stack([values[i].detach().reshape(()).to(device=device, dtype=torch.float64)
                                  for i in on_device]))
    tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    reduced = tensor.tolist()
    out = [0.0] * len(values)
    for position, index in enumerate(host + on_device):
        out[index] = reduced[position]
    return out
