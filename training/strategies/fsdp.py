"""FSDP2: parameters, gradients and optimizer state sharded across ranks with `fully_shard`,
one shard group per decoder layer (the model's `_no_split_modules`) plus the root.

Ray Train's `prepare_model(parallel_strategy="fsdp")` refuses CPU, so the model is wrapped here
directly, which works over gloo on CPU and NCCL on GPUs alike.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import ray.train.torch

from eft.training.config import TrainConfig
from eft.training.model import compute_dtype
from eft.training.strategies.common import no_autocast, trainable_parameters

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
_FULL_OPTIMIZER = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _layer_classes(model: torch.nn.Module) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(getattr(base, "_no_split_modules", None) or [])


class FSDPStrategy:
    name = "fsdp"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def prepare(self, model: torch.nn.Module) -> None:
        model.to(ray.train.torch.get_device())
        dtype = compute_dtype(self.cfg)
        kwargs: dict[str, Any] = {
            "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        }
        if self.cfg.offload != "none":  # FSDP offloads parameters, gradients and optimizer together
            # Pinned host memory needs an accelerator; on CPU the policy still keeps the
            # optimizer step on host tensors.
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=self.cfg.use_gpu)
        layer_classes = _layer_classes(model)
        for module in model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        self.module = self.model = model
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(model), lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay
        )

    def accumulate(self, last: bool):  # noqa: ANN201
        # Skipping the reduce-scatter for all but the last micro-batch, as DDP's no_sync does.
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def autocast(self):  # noqa: ANN201
        return no_autocast()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, lr: float) -> torch.Tensor | None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        norm = None
        if self.cfg.max_grad_norm:
            total = torch.nn.utils.clip_grad_norm_(trainable_parameters(self.model), self.cfg.max_grad_norm)
            # A tensor, not a float: reading it would wait for the device every step (the loop
            # reads it at reports only); the DTensor's full value is a collective, not a host read.
            norm = total.full_tensor() if hasattr(total, "full_tensor") else total
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return get_model_state_dict(self.model, options=_FULL)

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=False))

    def optimizer_state(self) -> dict[str, Any]:
        # Consolidated (full tensors by parameter name, on rank 0), so it loads at any world size.
        return get_optimizer_state_dict(self.model, self.optimizer, options=_FULL_OPTIMIZER)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        # Every rank passes the full state; each keeps its own shard of it.
        set_optimizer_state_dict(self.model, self.optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))

