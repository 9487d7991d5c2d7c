"""Sample packing: same loss and gradients as padded micro-batches, no attention across examples.

A two-layer Llama built from config (random weights, fp32) runs every attention path a packed
micro-batch can take in training: the per-example kernels (`eft_packed`, `eft_packed_eager`,
what jobs with sdpa or eager attention run), the stock kernels given only the position ids
(transformers' block-diagonal mask, what a model called without the boundaries falls back to),
the per-example kernels on a CUDA device too where there is one (in bf16 the device path: one
`varlen_attn` call per layer), and flash-attention's varlen kernel where CUDA and flash-attn are
installed.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from eft.training.attention import VARLEN_NAMES, register
from eft.training.data import IGNORE_INDEX, Example, collate
from eft.training.steps import token_loss_sum
from eft.training.packing import (balance_by_tokens, collate_packed, pack_rows, packed_inputs, packed_micro_batches,
                                  packed_targets, real_tokens)

PAD = 0
CUDA = torch.cuda.is_available()
FLASH = CUDA and importlib.util.find_spec("flash_attn") is not None
#: (kernel the model runs, kernel the job asked for, device, dtype)
PATHS = [
    ("eft_packed", "sdpa", "cpu", torch.float32),
    ("eft_packed_eager", "eager", "cpu", torch.float32),
    ("sdpa", "sdpa-position-ids", "cpu", torch.float32),
    ("eager", "eager-position-ids", "cpu", torch.float32),
    pytest.param("eft_packed", "sdpa", "cuda", torch.float32,
                 marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA device")),
    pytest.param("eft_packed_eager", "eager", "cuda", torch.float32,
                 marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA device")),
    # bf16 on a GPU: one varlen_attn call per layer (the device path), where fp32 runs per example
    pytest.param("eft_packed", "sdpa", "cuda", torch.bfloat16,
                 marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA device")),
    pytest.param("flash_attention_2", "flash_attention_2", "cuda", torch.bfloat16,
                 marks=pytest.mark.skipif(not FLASH, reason="flash-attention needs CUDA and the flash-attn package")),
]


def tiny_llama(attention: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
               sliding_window: int | None = None) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    register()
    torch.manual_seed(0)
    if sliding_window is not None:
        config = MistralConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               sliding_window=sliding_window, attn_implementation=attention)
        return MistralForCausalLM(config).to(device, dtype).eval()
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attn_implementation=attention)
    return LlamaForCausalLM(config).to(device, dtype).eval()


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


def packed_batch(examples: list[Example], kernel: str, device: str) -> dict:
    """A packed micro-batch as the loop hands it to the model; for the stock kernels only the
    position ids, as a caller that does not pass the boundaries would."""
    host = collate_packed(examples, PAD)
    inputs = packed_inputs(host, torch.device(device), kernel)
    if "position-ids" in kernel:
        inputs = {k: inputs[k] for k in ("input_ids", "position_ids")}
    return {**inputs, **packed_targets(host, torch.device(device))}


@pytest.mark.parametrize("model_kernel,kernel,device,dtype", PATHS)
def test_packed_loss_and_gradients_equal_padded(model_kernel: str, kernel: str, device: str, dtype) -> None:
    # The padded reference runs the stock kernel (eager for the eager paths, sdpa otherwise).
    reference = "eager" if "eager" in kernel else "sdpa"
    padded_model = tiny_llama(reference, device, dtype)
    model = tiny_llama(model_kernel, device, dtype)
    batch = examples([5, 17, 3, 40, 9, 26, 12, 33])

    padded = token_loss_sum(padded_model, {k: v.to(device) for k, v in collate(batch, PAD).items()})
    padded.backward()

    micro_batches = packed_micro_batches(batch, token_budget=80)
    assert len(micro_batches) > 1  # several forward passes, as with accumulation
    assert all(len(mb) > 2 for mb in micro_batches)  # and several examples in each pass
    packed = sum(token_loss_sum(model, packed_batch(mb, kernel, device)) for mb in micro_batches)
    packed.backward()

    # Same token losses summed in another order and other matmul shapes: fp32 round-off only
    # (~1e-7 relative per op over a few hundred terms); bf16 on the GPU rounds each op to 3 digits.
    rel, atol = (1e-5, 1e-6) if dtype == torch.float32 else (2e-2, 2e-2)
    assert packed.item() == pytest.approx(padded.item(), rel=rel)
    torch.testing.assert_close(grads(model), grads(padded_model), rtol=100 * rel, atol=atol)
    target_tokens = sum(e.loss_tokens for e in batch)
    assert sum(int((collate_packed(mb, PAD)["labels"][:, 1:] != IGNORE_INDEX).sum())
               for mb in micro_batches) == target_tokens


@pytest.mark.parametrize("model_kernel,kernel,device,dtype", PATHS)
@torch.no_grad()
def test_packed_example_never_attends_to_another(model_kernel: str, kernel: str, device: str, dtype) -> None:
    model = tiny_llama(model_kernel, device, dtype)
    alone_model = tiny_llama("eager" if "eager" in kernel else "sdpa", device, dtype)
    a, b, c = examples([11, 7, 9], seed=2)
    row = packed_batch([a, b, c], kernel, device)
    inputs = {k: v for k, v in row.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits

    # Change every token of A: B's and C's logits must not move at all.
    perturbed = row["input_ids"].clone()
    perturbed[0, :11] = (perturbed[0, :11] + 13) % 96 + 1
    moved = model(**{**inputs, "input_ids": perturbed}, use_cache=False).logits
    assert not torch.allclose(moved[0, :11], logits[0, :11])
    assert torch.equal(moved[0, 11:], logits[0, 11:])

    # And each example's logits are those it gets alone (positions restart at 0).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for start, example in ((0, a), (11, b), (18, c)):
        alone = alone_model(input_ids=torch.tensor([example.input_ids], device=device), use_cache=False).logits
        n = len(example.input_ids)
        torch.testing.assert_close(logits[0, start : start + n], alone[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
@torch.no_grad()
def test_sliding_window_stays_inside_each_example(kernel: str) -> None:
    """A Mistral with a 6-token window: packed examples longer than the window see exactly the
    window they see alone (transformers' own kernel on each example is the reference)."""
    model = tiny_llama(VARLEN_NAMES[kernel], sliding_window=6)
    reference = tiny_llama(kernel, sliding_window=6)
    a, b = examples([15, 10], seed=3)
    row = packed_batch([a, b], kernel, "cpu")
    logits = model(**{k: v for k, v in row.items() if k != "labels"}, use_cache=False).logits
    for start, example in ((0, a), (15, b)):
        alone = reference(input_ids=torch.tensor([example.input_ids]), use_cache=False).logits
        torch.testing.assert_close(logits[0, start : start + len(example.input_ids)], alone[0], rtol=1e-5, atol=1e-5)
    # The window is real: without it the long example's late tokens would see more.
    wide = tiny_llama(kernel)
    wide.load_state_dict(reference.state_dict())
    unwindowed = wide(input_ids=torch.tensor([a.input_ids]), use_cache=False).logits
    assert not torch.allclose(unwindowed[0, 8:], logits[0, 8:15], atol=1e-4)


def test_padded_batches_take_the_stock_kernel_through_the_varlen_name() -> None:
    """Evaluation runs padded batches on the packed job's model: same loss as the stock kernel."""
    batch = examples([5, 17, 3, 40])
    for kernel in ("sdpa", "eager"):
        tensors = collate(batch, PAD)
        stock = token_loss_sum(tiny_llama(kernel), tensors)
        varlen = token_loss_sum(tiny_llama(VARLEN_NAMES[kernel]), tensors)
        assert varlen.item() == pytest.approx(stock.item(), rel=1e-6)


def test_ranks_get_balanced_token_shares() -> None:
    lengths = [480, 20, 300, 150, 90, 60, 410, 33, 250, 120, 75, 18, 200, 16, 64, 350]
    shares = balance_by_tokens(lengths, 2)
    assert sorted(p for share in shares for p in share) == list(range(len(lengths)))
    totals = [sum(lengths[p] for p in share) for share in shares]
    assert abs(totals[0] - totals[1]) <= max(lengths[p] for share in shares for p in share) // 20 + 16
    # Contiguous halves (the unbalanced split) differ far more on the same data.
    halves = [sum(lengths[:8]), sum(lengths[8:])]
    assert abs(halves[0] - halves[1]) > 4 * abs(totals[0] - totals[1])
    assert balance_by_tokens(lengths, 2) == shares  # deterministic
    assert [len(s) for s in balance_by_tokens([5, 5], 4)] == [1, 1, 0, 0]


def test_rows_hold_every_example_once_within_capacity() -> None:
    batch = examples([30, 5, 25, 10, 50, 3, 20, 60])
    rows = pack_rows(batch, row_len=60)
    packed = [e for row in rows for e in row]
    assert sorted(map(id, packed)) == sorted(map(id, batch))
    assert all(sum(len(e.input_ids) for e in row) <= 60 for row in rows)
    assert len(rows) == 4  # 203 tokens need at least 4 rows of 60; first-fit decreasing finds 4
    assert pack_rows(batch, row_len=60) == rows  # deterministic
    assert sum(real_tokens(row) for row in rows) == sum(len(e.input_ids) for e in batch)
    tensors = collate_packed(rows[1], PAD)
    n = sum(len(e.input_ids) for e in rows[1])
    assert tensors["input_ids"].shape == (1, n) and "attention_mask" not in tensors
    assert tensors["cu_seq_lens"].tolist() == [0, *torch.tensor([len(e.input_ids) for e in rows[1]]).cumsum(0).tolist()]
    assert int(tensors["max_length"]) == max(len(e.input_ids) for e in rows[1])
