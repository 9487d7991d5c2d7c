"""A training step's batches on one Ray Train worker: which records of the global batch are this
rank's, in how many micro-batches (padded, or packed into rows of up to `max_seq_len`), collated
on the host, and moved to the device. Every rank gets the same number of micro-batches; the
next step's are built in the background while a step trains (collation is host work)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from eft.training.config import TrainConfig
from eft.training.data import collate, example_tokens, global_batch_indices, shard_for_rank
from eft.training.objectives import Objective
from eft.training.packing import (balance_by_tokens, collate_packed, packed_inputs, packed_micro_batches,
                                  packed_targets, real_tokens)


class Batches:
    def __init__(self, cfg: TrainConfig, objective: Objective, examples: list[Any], pad_id: int, rank: int,
                 world_size: int, device: torch.device):
        self.cfg, self.objective, self.examples, self.pad_id = cfg, objective, examples, pad_id
        self.rank, self.world_size, self.device = rank, world_size, device
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eft-batches")
        self._prefetch: tuple[int, Future] | None = None

    def micro_batches(self, step: int) -> tuple[list[Any], float]:
        """This rank's micro-batches for `step`, and the global batch's target-token count.

        Every rank gets the same number of micro-batches (sharded strategies run collectives
        in each forward and backward); a rank with too few examples gets empty ones, which
        `train_step` runs as zero-weight passes. Packed, a micro-batch is `micro_batch_size`
        rows of up to `max_seq_len` tokens each; every rank packs every rank's share (a pure
        function of the step), so all agree on the count without a collective.
        """
        cfg = self.cfg
        n = len(self.examples)
        indices = global_batch_indices(n, cfg.seed, step, cfg.global_batch_size)
        # The loss is a mean over the objective's units: target tokens, or pairs.
        global_tokens = self.objective.units([self.examples[i] for i in indices])
        if cfg.packing:
            # The ranks' shares are balanced by tokens (a rank's step time follows its tokens),
            # then packed into micro-batches of at most micro_batch_size x max_seq_len tokens
            # (a record of several sequences, a DPO pair, is packed whole: that many budgets).
            lengths = [example_tokens(self.examples[i]) for i in indices]
            budget = cfg.micro_batch_size * cfg.max_seq_len * self.objective.sequences_per_record
            shares = [packed_micro_batches([self.examples[indices[p]] for p in share], budget)
                      for share in balance_by_tokens(lengths, self.world_size)]
            count = max(len(share) for share in shares)
            return shares[self.rank] + [[]] * (count - len(shares[self.rank])), float(global_tokens)
        mine = [self.examples[i] for i in shard_for_rank(indices, self.rank, self.world_size)]
        largest_share = -(-cfg.global_batch_size // self.world_size)
        count = -(-largest_share // cfg.micro_batch_size)
        return [list(part) for part in np.array_split(np.asarray(mine, dtype=object), count)], float(global_tokens)

    def host(self, step: int) -> tuple[list[tuple[dict[str, torch.Tensor], int, float]], float]:
        """Step `step`'s micro-batches as host tensors with their non-padding token counts (known
        on the host: no device sync) and loss weights, and the global target-token count."""
        micro_batches, global_tokens = self.micro_batches(step)
        pin = self.device.type == "cuda"  # pinned memory lets the copy overlap with compute
        out = []
        for micro_batch in micro_batches:
            # An empty share still joins the collectives, with a zero-weight pass.
            examples = self.objective.sequences(micro_batch or [self.examples[0]])
            if self.cfg.packing:
                batch, tokens = collate_packed(examples, self.pad_id), real_tokens(examples)
            else:
                batch, tokens = collate(examples, self.pad_id), sum(len(e.input_ids) for e in examples)
            if pin:
                batch = {k: v if k == "max_length" else v.pin_memory() for k, v in batch.items()}
            out.append((batch, tokens, 1.0 if micro_batch else 0.0))
        return out, global_tokens

    def for_step(self, step: int) -> tuple[list[tuple[dict[str, torch.Tensor], int, float]], float]:
        """Step `step`'s host batches (built in the background during the previous step), and
        start building the next step's."""
        if self._prefetch is not None and self._prefetch[0] == step:
            ready = self._prefetch[1].result()
        else:
            ready = self.host(step)
        self._prefetch = None
        if step + 1 < self.cfg.total_steps:
            self._prefetch = (step + 1, self._loader.submit(self.host, step + 1))
        return ready

    def to_device(self, host_batch: dict[str, torch.Tensor], pin: bool) -> dict[str, Any]:
        if "cu_seq_lens" in host_batch:
            return {**packed_inputs(host_batch, self.device, self.cfg.attention),
                    **packed_targets(host_batch, self.device)}
        return {k: v.to(self.device, non_blocking=pin) for k, v in host_batch.items()}
