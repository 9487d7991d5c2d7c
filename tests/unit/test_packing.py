"""Sample packing: same loss and gradients as padded micro-batches, no attention across examples.

A two-layer Llama built from config (random weights, fp32) runs the real transformers attention
paths (SDPA and eager) that a packed batch takes in training.
"""

from __future__ import annotations

import random

import pytest
import torch

from eft.training.data import IGNORE_INDEX, Example, collate
from eft.training.steps import token_loss_sum
from eft.training.packing import collate_packed, pack_rows, packed_micro_batches, real_tokens

PAD = 0


def tiny_llama(attention: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attn_implementation=attention)
    return LlamaForCausalLM(config).eval()


def examples(lengths: list[int], seed: int = 1) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = [rng.randrange(1, 97) for _ in range(n)]
        prompt = rng.randrange(0, n // 2 + 1)  # the prompt is not a target, as in SFT data
        out.append(Example(ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    return out


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_padded(attention: str) -> None:
    model = tiny_llama(attention)
    batch = examples([5, 17, 3, 40, 9, 26, 12, 33])

    model.zero_grad()
    padded = token_loss_sum(model, collate(batch, PAD))
    padded.backward()
    padded_grads = grads(model).clone()

    model.zero_grad()
    micro_batches = packed_micro_batches(batch, row_len=48, rows_per_batch=2)
    assert len(micro_batches) > 1  # several forward passes, as with accumulation
    packed = sum(token_loss_sum(model, collate_packed(rows, PAD)) for rows in micro_batches)
    packed.backward()

    # Same token losses summed in another order and other matmul shapes: fp32 round-off only
    # (~1e-7 relative per op over a few hundred terms).
    assert packed.item() == pytest.approx(padded.item(), rel=1e-5)
    torch.testing.assert_close(grads(model), padded_grads, rtol=1e-4, atol=1e-6)
    target_tokens = sum(e.loss_tokens for e in batch)
    assert sum(int((collate_packed(r, PAD)["labels"][:, 1:] != IGNORE_INDEX).sum())
               for r in micro_batches) == target_tokens


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@torch.no_grad()
def test_packed_example_never_attends_to_another(attention: str) -> None:
    model = tiny_llama(attention)
    a, b, c = examples([11, 7, 9], seed=2)
    row = collate_packed([[a, b, c]], PAD)
    logits = model(input_ids=row["input_ids"], position_ids=row["position_ids"], use_cache=False).logits

    # Change every token of A: B's and C's logits must not move at all.
    perturbed = row["input_ids"].clone()
    perturbed[0, :11] = (perturbed[0, :11] + 13) % 96 + 1
    moved = model(input_ids=perturbed, position_ids=row["position_ids"], use_cache=False).logits
    assert not torch.allclose(moved[0, :11], logits[0, :11])
    assert torch.equal(moved[0, 11:], logits[0, 11:])

    # And each example's logits are those it gets alone (positions restart at 0).
    for start, example in ((0, a), (11, b), (18, c)):
        alone = model(input_ids=torch.tensor([example.input_ids]), use_cache=False).logits
        n = len(example.input_ids)
        torch.testing.assert_close(logits[0, start : start + n], alone[0], rtol=1e-5, atol=1e-5)


def test_rows_hold_every_example_once_within_capacity() -> None:
    batch = examples([30, 5, 25, 10, 50, 3, 20, 60])
    rows = pack_rows(batch, row_len=60)
    packed = [e for row in rows for e in row]
    assert sorted(map(id, packed)) == sorted(map(id, batch))
    assert all(sum(len(e.input_ids) for e in row) <= 60 for row in rows)
    assert len(rows) == 4  # 203 tokens need at least 4 rows of 60; first-fit decreasing finds 4
    assert pack_rows(batch, row_len=60) == rows  # deterministic
    assert real_tokens(rows) == sum(len(e.input_ids) for e in batch)
    tensors = collate_packed(rows, PAD)
    assert tensors["input_ids"].shape == (4, 60)
    assert "attention_mask" not in tensors
