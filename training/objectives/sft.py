"""Supervised fine-tuning: the loss of a batch is the mean next-token cross-entropy over its
trained tokens (`training/steps.py:token_loss_sum`), whatever the number of workers or
micro-batches."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from eft.training.data import Example
from eft.training.steps import token_loss_sum


class TokenLoss:
    metrics: tuple[str, ...] = ()
    sequences_per_record = 1

    def units(self, records: Sequence[Example]) -> float:
        return float(sum(e.loss_tokens for e in records))

    def sequences(self, records: Sequence[Example]) -> list[Example]:
        return list(records)

    def prompt_examples(self, records: Sequence[Example]) -> list[Example]:
        return list(records)

    def prepare(self, strategy: Any, device: torch.device) -> None:
        pass

    def before(self, strategy: Any, batch: dict[str, Any], host_batch: dict[str, torch.Tensor]) -> None:
        return None

    def loss(self, model: Any, batch: dict[str, Any], prepared: None,
             weight: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return token_loss_sum(model, batch) * weight, {}
