"""DDP: every rank holds the whole model; gradients are averaged with one all-reduce per step
(gloo on CPU, NCCL on GPUs), set up by Ray Train's `prepare_model`."""

from __future__ import annotations

import contextlib
from typing import Any

import ray.train.torch
import torch

from training.config import TrainConfig
from training.model import load_trainable_state, trainable_state
from training.strategies import trainable_parameters


class DDPStrategy:
    name = "ddp"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def prepare(self, model: torch.nn.Module) -> None:
        self.module = model
        self.model = ray.train.torch.prepare_model(model)
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(model), lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay
        )

    def accumulate(self, last: bool):  # noqa: ANN201
        distributed = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
        return contextlib.nullcontext() if last or not distributed else self.model.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, lr: float) -> float | None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        norm = None
        if self.cfg.max_grad_norm:
            norm = float(torch.nn.utils.clip_grad_norm_(trainable_parameters(self.module), self.cfg.max_grad_norm))
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
