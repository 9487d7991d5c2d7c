"""DDP: every rank holds the whole model; gradients are averaged with one all-reduce per step
(gloo on CPU, NCCL on GPUs), set up by Ray Train's `prepare_model`. Mixed precision is
torch autocast over fp32 weights; fp16 adds dynamic loss scaling (GradScaler)."""

from __future__ import annotations

import contextlib
from typing import Any

import ray.train.torch
import torch

from eft.training.config import TrainConfig
from eft.training.lora import keep_activation_dtype
from eft.training.model import compute_dtype, load_trainable_state, trainable_state
from eft.training.strategies.common import trainable_parameters


class DDPStrategy:
    name = "ddp"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def prepare(self, model: torch.nn.Module) -> None:
        self.module = model
        self.model = ray.train.torch.prepare_model(model)
        self.device_type = ray.train.torch.get_device().type
        self.dtype = compute_dtype(self.cfg)
        if self.dtype != torch.float32:
            keep_activation_dtype(model)  # autocast casts for the adapters' products
        self.scaler = (
            torch.amp.GradScaler(self.device_type) if self.dtype == torch.float16 else None
        )
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(model), lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay,
            # One fused kernel for the whole update on a GPU; the CPU kernel is slower for LoRA-sized tensors.
            fused=self.device_type == "cuda" or None,
        )

    def accumulate(self, last: bool):  # noqa: ANN201
        distributed = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
        return contextlib.nullcontext() if last or not distributed else self.model.no_sync()

    def autocast(self):  # noqa: ANN201
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, lr: float) -> torch.Tensor | None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = None
        if self.cfg.max_grad_norm:
            # A tensor, not a float: reading it would wait for the device every step.
            norm = torch.nn.utils.clip_grad_norm_(trainable_parameters(self.module), self.cfg.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)  # skips the update when gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return trainable_state(self.module)

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        load_trainable_state(self.module, state)

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
