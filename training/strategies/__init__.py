"""Distribution strategies: a closed registry, one module each, none subclassing another.

Every strategy takes the trainable model from `training/model.py` and gives the training loop
the same small surface (`Strategy` below), so the loop reads the same whatever the strategy.
Names come from the job request (`strategy`) and are looked up here only.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Protocol

import torch

from eft.training.config import TrainConfig


class Strategy(Protocol):
    name: str
    #: What the loop calls for the forward pass (a DDP/FSDP/DeepSpeed wrapper).
    model: torch.nn.Module
    #: The bare (PEFT) model, for generation and `save_pretrained`.
    module: torch.nn.Module

    def prepare(self, model: torch.nn.Module) -> None:
        """Wrap `model` for this strategy and build its optimizer."""

    def accumulate(self, last: bool) -> AbstractContextManager[Any]:
        """Context for one micro-batch's backward; gradients are reduced across ranks only
        when `last` is true."""

    def autocast(self) -> AbstractContextManager[Any]:
        """Context for the forward pass: mixed precision where the strategy applies it there."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, lr: float) -> float | None:
        """Clip, apply one optimizer update at `lr`, clear gradients. Returns the grad norm."""

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Full trainable parameters by name, on CPU. A collective: call on every rank."""

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None: ...

    def optimizer_state(self) -> dict[str, Any]:
        """This rank's optimizer state (a shard for sharded strategies)."""

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...


def _ddp(cfg: TrainConfig) -> Strategy:
    from eft.training.strategies.ddp import DDPStrategy

    return DDPStrategy(cfg)


def _fsdp(cfg: TrainConfig) -> Strategy:
    from eft.training.strategies.fsdp import FSDPStrategy

    return FSDPStrategy(cfg)


def _zero(stage: int) -> Callable[[TrainConfig], Strategy]:
    def build(cfg: TrainConfig) -> Strategy:
        from eft.training.strategies.deepspeed_zero import ZeroStrategy

        return ZeroStrategy(cfg, stage)

    return build


REGISTRY: dict[str, Callable[[TrainConfig], Strategy]] = {
    "ddp": _ddp, "fsdp": _fsdp, "zero1": _zero(1), "zero2": _zero(2), "zero3": _zero(3),
}


def build_strategy(cfg: TrainConfig) -> Strategy:
    """The strategy named by `cfg.strategy`. Raises KeyError for a name not in the registry."""
    try:
        factory = REGISTRY[cfg.strategy]
    except KeyError:
        raise KeyError(f"unknown strategy {cfg.strategy!r}; known: {', '.join(REGISTRY)}") from None
    return factory(cfg)
