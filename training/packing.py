"""Sample packing: variable-length examples laid end to end, without padding between them.

A packed micro-batch is one flattened row of whole examples (none is split) holding at most
`micro_batch_size x max_seq_len` tokens, the budget the planner counts. Each example's position
ids restart at 0 and its boundaries go to the model as `cu_seq_lens_q/k` with the longest length
as `max_length_q/k`: flash-attention runs its varlen kernel on them, and SDPA / eager attention
run per example (`training/attention.py`). An example therefore attends only to itself, sees
the same positions as when trained alone, and contributes exactly the same token losses:
packing changes how many pad tokens are computed, not what is learned. One row per micro-batch
is also what transformers needs to read packed sequences from `position_ids` alone, which a
model called without the boundaries falls back to.

A step's global batch is split across ranks by tokens (longest first, each to the rank with the
fewest so far), then each rank fills its micro-batches first-fit in decreasing length order. Both
depend only on the examples, so a step's micro-batches are a function of (seed, step, rank,
world size) like the unpacked ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from eft.training.data import IGNORE_INDEX, Example, example_tokens

if TYPE_CHECKING:  # torch is imported where tensors are made: the API's process never needs it
    import torch


def pack_rows(examples: Sequence[Example], row_len: int) -> list[list[Example]]:
    """Group examples into bins of at most `row_len` tokens (first-fit decreasing).

    Returns the bins, longest first; an example longer than `row_len` gets a bin of its own.
    Ties keep the input order, so the result is deterministic.
    """
    sizes = [example_tokens(e) for e in examples]  # a DPO pair is packed whole
    order = sorted(range(len(examples)), key=lambda i: -sizes[i])
    rows: list[list[Example]] = []
    free: list[int] = []
    for i in order:
        example = examples[i]
        size = sizes[i]
        for r, room in enumerate(free):
            if size <= room:
                rows[r].append(example)
                free[r] -= size
                break
        else:
            rows.append([example])
            free.append(row_len - size)
    return rows


def packed_micro_batches(examples: Sequence[Example], token_budget: int) -> list[list[Example]]:
    """This share's micro-batches: whole examples, at most `token_budget` tokens to a forward pass."""
    return pack_rows(examples, token_budget)


def balance_by_tokens(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Positions into `lengths` for each rank, so that the ranks' token totals are as even as
    longest-first greedy makes them (each to the rank with the fewest tokens so far; ties to the
    lower rank). Every rank gets an example whenever there are enough of them."""
    shares: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        rank = min(range(world_size), key=lambda r: (totals[r], len(shares[r]), r))
        shares[rank].append(i)
        totals[rank] += lengths[i]
    return [sorted(share) for share in shares]


def collate_packed(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A packed micro-batch as one row: input_ids, labels and position_ids of shape [1, tokens],
    `cu_seq_lens` (int32, the examples' boundaries: 0, n1, n1+n2, ...), `max_length`, and for
    the loss `keep` (the positions that predict a target) and `targets` (what they predict)."""
    import torch

    del pad_token_id  # nothing is padded
    lengths = [len(e.input_ids) for e in examples]
    input_ids = torch.tensor([t for e in examples for t in e.input_ids], dtype=torch.long)
    # The first token of an example is never a target of the token before it (which belongs to
    # another example): the loss shifts labels by one, so mask it here.
    labels = torch.tensor([t for e in examples for t in [IGNORE_INDEX, *e.labels[1:]]], dtype=torch.long)
    position_ids = torch.cat([torch.arange(n) for n in lengths])
    bounds = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    bounds[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    # What the loss needs, found here on the host: the positions that predict a target (position
    # t predicts the label at t + 1) and those targets.
    targets = torch.cat([labels[1:], torch.tensor([IGNORE_INDEX])])
    keep = (targets != IGNORE_INDEX).nonzero().squeeze(1)
    return {"input_ids": input_ids[None], "labels": labels[None], "position_ids": position_ids[None],
            "cu_seq_lens": bounds, "max_length": torch.tensor(max(lengths)),
            "keep": keep, "targets": targets[keep]}


def packed_inputs(batch: dict[str, torch.Tensor], device: torch.device, kernel: str) -> dict[str, object]:
    """The model's keyword arguments for a collated packed micro-batch on `device`, copied
    without blocking (from pinned memory where the loop pinned it).

    The boundaries go to the device for flash-attention's kernels and for the per-example
    kernels' device path (one varlen call per layer, `training/attention.py`), which also keep
    the host values on the copy (`host_bounds`) for any layer that reads them; on the CPU they
    stay on the host. The per-example kernels get `PACKED_ROW_MASK`: transformers then builds no
    mask, and does not look for packed sequences in the position ids (a device sync)."""
    from eft.training.attention import FLASH_KERNELS, PACKED_ROW_MASK

    bounds = batch["cu_seq_lens"]
    if kernel in FLASH_KERNELS or device.type != "cpu":
        host_bounds = bounds.tolist()
        bounds = bounds.to(device, non_blocking=True)
        bounds.host_bounds = host_bounds
    longest = int(batch["max_length"])
    inputs: dict[str, object] = {
        "input_ids": batch["input_ids"].to(device, non_blocking=True),
        "position_ids": batch["position_ids"].to(device, non_blocking=True),
        "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest}
    if kernel not in FLASH_KERNELS:
        inputs["attention_mask"] = PACKED_ROW_MASK
    return inputs


def packed_targets(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The loss's side of a collated packed micro-batch on `device`: labels, and the kept
    positions with their targets (`collate_packed`), copied without blocking."""
    return {k: batch[k].to(device, non_blocking=True) for k in ("labels", "keep", "targets")}


def real_tokens(examples: Sequence[Example]) -> int:
    """Tokens of a packed micro-batch (all real: known on the host, no device sync)."""
    return sum(len(e.input_ids) for e in examples)


#: Architectures (config `model_type`) whose attention honours the position-id restarts that
#: separate packed examples, checked per family by the conformance tests. Others (OPT's learned
#: positions from the attention mask, Bloom's ALiBi from the mask) would let an example attend
#: to the ones before it in its row, so they are trained padded instead.
PACKED_ARCHITECTURES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi3", "gpt2", "gpt_neox",
})


def packing_is_exact(model_type: str) -> bool:
    """Whether examples packed in a row stay independent for this architecture."""
    return model_type in PACKED_ARCHITECTURES
