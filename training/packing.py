"""Sample packing: variable-length examples laid end to end in rows, without padding between them.

A packed row holds whole examples (none is split); each example's position ids restart at 0, and
no attention mask is passed. From that, transformers builds a block-diagonal causal mask for
SDPA and eager attention (`masking_utils.find_packed_sequence_indices`: a new sequence starts
wherever the position ids do not go up by one), and flash-attention runs its varlen kernel on
the same position ids. An example therefore attends only to itself, sees the same positions as
when trained alone, and contributes exactly the same token losses: packing changes how many
pad tokens are computed, not what is learned.

Rows are filled first-fit in decreasing length order, which depends only on the examples, so a
step's micro-batches are a function of (seed, step, rank, world size) like the unpacked ones.
"""

from __future__ import annotations

from typing import Sequence

import torch

from eft.training.data import IGNORE_INDEX, Example


def pack_rows(examples: Sequence[Example], row_len: int) -> list[list[Example]]:
    """Group examples into rows of at most `row_len` tokens (first-fit decreasing).

    Returns the rows, longest first; an example longer than `row_len` gets a row of its own.
    Ties keep the input order, so the result is deterministic.
    """
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].input_ids))
    rows: list[list[Example]] = []
    free: list[int] = []
    for i in order:
        example = examples[i]
        size = len(example.input_ids)
        for r, room in enumerate(free):
            if size <= room:
                rows[r].append(example)
                free[r] -= size
                break
        else:
            rows.append([example])
            free.append(row_len - size)
    return rows


def packed_micro_batches(examples: Sequence[Example], row_len: int, rows_per_batch: int) -> list[list[list[Example]]]:
    """This share's micro-batches: packed rows, `rows_per_batch` to a forward pass."""
    rows = pack_rows(examples, row_len)
    return [rows[i : i + rows_per_batch] for i in range(0, len(rows), rows_per_batch)]


def collate_packed(rows: Sequence[Sequence[Example]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Packed rows as [rows, length] input_ids, labels and position_ids (no attention_mask).

    Rows shorter than the longest are padded at the end; the padding is ignored by the loss
    and, starting its own position run, is a separate block that no example attends to.
    """
    length = max(sum(len(e.input_ids) for e in row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for example in row:
            n = len(example.input_ids)
            input_ids[r, start : start + n] = torch.tensor(example.input_ids)
            # The first token of an example is never a target of the token before it (which
            # belongs to another example): the loss shifts labels by one, so mask it here.
            labels[r, start : start + n] = torch.tensor([IGNORE_INDEX] + list(example.labels[1:]))
            position_ids[r, start : start + n] = torch.arange(n)
            start += n
        position_ids[r, start:] = torch.arange(length - start)
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


def real_tokens(rows: Sequence[Sequence[Example]]) -> int:
    """Non-padding tokens of a packed micro-batch (known on the host: no device sync)."""
    return sum(len(e.input_ids) for row in rows for e in row)


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
