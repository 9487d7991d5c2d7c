"""Preference tuning (DPO): a record is a pair of replies to one prompt, trained as its two
sequences (every chosen one of a micro-batch, then every rejected one); the loss is DPO's over
the pairs (`training/preference.py`), each reply's log-probability taken against a reference: the
base model itself for LoRA and QLoRA (the adapter switched off for one forward pass without
gradients), a frozen copy of it for full fine-tuning."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from eft.training.config import TrainConfig
from eft.training.data import Example, Pair
from eft.training.model import load_reference_model
from eft.training.preference import PAIR_METRICS, micro_batch_loss, pair_logps, pair_sequences, sequence_bounds


class Preference:
    metrics = PAIR_METRICS
    sequences_per_record = 2

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.reference: torch.nn.Module | None = None  # full fine-tuning: the frozen base

    def units(self, records: Sequence[Pair]) -> float:
        return float(len(records))

    def sequences(self, records: Sequence[Pair]) -> list[Example]:
        return pair_sequences(records)

    def prompt_examples(self, records: Sequence[Pair]) -> list[Example]:
        return [p.chosen for p in records]

    def prepare(self, strategy: Any, device: torch.device) -> None:
        if self.cfg.method == "full":
            self.reference = load_reference_model(self.cfg, device)

    @torch.no_grad()
    def before(self, strategy: Any, batch: dict[str, Any], host_batch: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        """The micro-batch's sequences and their log-probabilities under the reference."""
        sequences = sequence_bounds(host_batch)
        if self.reference is not None:
            model, switched_off = self.reference, contextlib.nullcontext()
        else:
            model, switched_off = strategy.model, strategy.module.disable_adapter()
        with switched_off, strategy.autocast():
            return sequences, pair_logps(model, batch, sequences)

    def loss(self, model: Any, batch: dict[str, Any], prepared: tuple[Any, Any],
             weight: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        sequences, reference = prepared
        return micro_batch_loss(pair_logps(model, batch, sequences), reference, self.cfg.dpo_beta, weight)
