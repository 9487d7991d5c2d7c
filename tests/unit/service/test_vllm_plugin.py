"""The model servers' vLLM LoRA ops (service/serving/vllm_plugin.py): a row with no adapter (index
-1) gets no delta, every other row the delta of its own slot."""

from __future__ import annotations

import torch

from eft.service.serving.vllm_plugin import bgmv_expand, bgmv_expand_slice, bgmv_shrink

SLOTS, RANK, HIDDEN, OUT = 3, 4, 8, 6


def _case():
    torch.manual_seed(0)
    x = torch.randn(5, HIDDEN)
    a = torch.randn(SLOTS, 1, RANK, HIDDEN)  # vLLM's stacked lora_a: (slots, 1, rank, in)
    b = torch.randn(SLOTS, 1, OUT, RANK)
    indices = torch.tensor([0, -1, 2, -1, 1])
    return x, a, b, indices


def test_shrink_gives_rows_without_an_adapter_zeros_and_the_others_their_slots():
    x, a, _, indices = _case()
    out = torch.full((5, RANK), 7.0)
    bgmv_shrink(x, a, out, indices, scaling=0.5)
    for row, slot in enumerate(indices.tolist()):
        want = torch.zeros(RANK) if slot < 0 else 0.5 * a[slot, 0] @ x[row]
        assert torch.allclose(out[row], want), (row, slot)


def test_expand_adds_nothing_to_rows_without_an_adapter():
    _, _, b, indices = _case()
    h = torch.randn(5, RANK)
    base = torch.randn(5, OUT)
    out = base.clone()
    bgmv_expand(h, b, out, indices, add_inputs=True)
    for row, slot in enumerate(indices.tolist()):
        want = base[row] if slot < 0 else base[row] + b[slot, 0] @ h[row]
        assert torch.allclose(out[row], want), (row, slot)
    # The last slot is what index -1 used to gather: it is never added to such rows.
    assert torch.equal(out[1], base[1]) and torch.equal(out[3], base[3])


def test_expand_slice_writes_only_its_slice_and_nothing_for_rows_without_an_adapter():
    _, _, b, indices = _case()
    h = torch.randn(5, RANK)
    base = torch.randn(5, OUT + 4)
    out = base.clone()
    bgmv_expand_slice(h, b, out, indices, 2, OUT, add_inputs=True)
    assert torch.equal(out[:, :2], base[:, :2]) and torch.equal(out[:, 2 + OUT:], base[:, 2 + OUT:])
    for row, slot in enumerate(indices.tolist()):
        want = base[row, 2:2 + OUT] if slot < 0 else base[row, 2:2 + OUT] + b[slot, 0] @ h[row]
        assert torch.allclose(out[row, 2:2 + OUT], want), (row, slot)
