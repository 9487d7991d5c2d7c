"""The chunked token loss: the same sum and gradient as `F.cross_entropy` on fp32 logits, with
fp32 buffers for one chunk at a time and only the gradient kept for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eft.training.steps import loss_chunk_tokens, token_cross_entropy_sum, token_loss_sum

VOCAB = 97


def _case(dtype: torch.dtype, rows: int = 3, length: int = 50):
    torch.manual_seed(0)
    logits = (torch.randn(rows, length, VOCAB) * 3).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (rows, length))
    labels[:, :7] = -100  # prompt tokens
    labels[1, 30:] = -100  # a short example's padding
    return logits, labels


def _reference(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    (grad,) = torch.autograd.grad(loss * 0.37, logits)
    return loss.detach(), grad


@pytest.mark.parametrize("chunk", [1, 16, 47, 10_000])
def test_fp32_sum_and_gradient_match_cross_entropy(chunk: int) -> None:
    logits, labels = _case(torch.float32)
    expected, expected_grad = _reference(logits, labels)
    loss = token_cross_entropy_sum(logits, labels, chunk=chunk)
    (grad,) = torch.autograd.grad(loss * 0.37, logits)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert grad[labels == -100].abs().max() == 0  # no gradient from positions that are not targets


def test_bf16_gradient_is_the_reference_to_bf16_rounding() -> None:
    logits, labels = _case(torch.bfloat16)
    expected, expected_grad = _reference(logits, labels)
    loss = token_cross_entropy_sum(logits, labels, chunk=16)
    (grad,) = torch.autograd.grad(loss * 0.37, logits)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-3)
    # Both round to bf16 (8 significant bits), the reference once and this loss twice (the
    # gradient, then its scaling): within 3 half-units in the last place of each other.
    torch.testing.assert_close(grad.float(), expected_grad.float(), rtol=3 * 2 ** -8, atol=1e-6)


def test_only_the_gradient_is_kept_for_backward() -> None:
    """What the loss saves for backward: the logits' gradient in their own dtype, no fp32 copy
    or log-softmax of the whole micro-batch (what `F.cross_entropy(logits.float())` keeps)."""
    logits, labels = _case(torch.bfloat16, rows=4, length=64)
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_cross_entropy_sum(logits, labels, chunk=16)
    ours = sum(saved)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    theirs = sum(saved)
    assert ours == logits.numel() * 2
    assert theirs >= logits.numel() * 4  # the fp32 log-softmax at least


def test_logits_saved_by_the_model_are_left_untouched() -> None:
    """Soft-capped logits (Gemma 2) are saved by tanh for backward: the loss works on copies."""
    torch.manual_seed(0)
    raw = torch.randn(2, 20, VOCAB, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 20))
    capped = torch.tanh(raw / 30.0) * 30.0
    token_cross_entropy_sum(capped, labels, chunk=8).backward()  # raises if tanh's output was modified
    reference = raw.detach().clone().requires_grad_()
    F.cross_entropy((torch.tanh(reference / 30.0) * 30.0).flatten(0, 1), labels.flatten(), reduction="sum").backward()
    torch.testing.assert_close(raw.grad, reference.grad, rtol=1e-5, atol=1e-7)


def test_rows_that_are_not_targets_may_hold_anything() -> None:
    """inf or NaN logits at positions that are not targets (padding, prompts) change nothing."""
    logits, labels = _case(torch.float32)
    expected, expected_grad = _reference(logits, labels)
    spoiled = logits.detach().clone()
    spoiled[labels == -100] = float("inf")
    spoiled[0, 0, 0] = float("nan")
    spoiled.requires_grad_()
    loss = token_cross_entropy_sum(spoiled, labels, chunk=16)
    (grad,) = torch.autograd.grad(loss * 0.37, spoiled)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)


def test_fp16_keeps_the_gradients_a_loss_scale_lifts() -> None:
    """Under fp16 with a loss scale, probabilities below fp16's smallest number still get their
    gradient (the buffer is fp32 until the scale has been applied)."""
    torch.manual_seed(0)
    logits = torch.full((2, 4, 2048), -12.0)
    logits[..., 0] = 12.0  # every other entry has probability ~4e-11: zero in fp16
    logits = logits.half().requires_grad_()
    labels = torch.zeros(2, 4, dtype=torch.long)
    scale = 65536.0  # a typical dynamic loss scale
    expected, expected_grad = (lambda loss: (loss, torch.autograd.grad(loss * scale, logits)[0]))(
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum"))
    (grad,) = torch.autograd.grad(token_cross_entropy_sum(logits, labels, chunk=3) * scale, logits)
    assert grad.dtype == torch.float16
    assert (expected_grad[..., 1:] != 0).all() and (grad[..., 1:] != 0).all()
    torch.testing.assert_close(grad.float(), expected_grad.float(), rtol=2e-3, atol=0)


def test_without_gradients_only_the_sum() -> None:
    logits, labels = _case(torch.float32)
    expected, _ = _reference(logits, labels)
    with torch.no_grad():
        loss = token_cross_entropy_sum(logits, labels, chunk=16)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-4)


def test_chunks_fit_the_budget_whatever_the_vocabulary() -> None:
    from eft.planner.memory import loss_chunk_tokens as planned

    for vocab in (97, 1_000, 32_000, 128_256, 151_936, 262_144):  # the planner counts the same chunk
        assert planned(vocab) == loss_chunk_tokens(vocab)
    assert loss_chunk_tokens(128_256) == 65  # Llama 3: 65 x 128k fp32 values per chunk
    assert loss_chunk_tokens(151_936) == 64  # Qwen 2.5 (the floor)
    assert loss_chunk_tokens(1_000) * 1_000 <= 1 << 23
    # On an accelerator a micro-batch takes at most 4 chunks, whatever its size; the planner too.
    for vocab, tokens in ((32_000, 16_384), (128_256, 4_096), (151_936, 100), (1_000, 50_000)):
        chunk = loss_chunk_tokens(vocab, tokens, "cuda")
        assert -(-tokens // chunk) <= 4 and chunk >= loss_chunk_tokens(vocab)
        assert planned(vocab, tokens, "cuda") == chunk
    assert loss_chunk_tokens(32_000, 16_384, "cpu") == loss_chunk_tokens(32_000)


def test_the_model_loss_pairs_each_position_with_the_next_label() -> None:
    """`token_loss_sum` = cross-entropy of logits[t] against labels[t + 1] on a real model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    input_ids = torch.randint(0, VOCAB, (2, 12))
    labels = input_ids.clone()
    labels[:, :4] = -100
    loss = token_loss_sum(model, {"input_ids": input_ids, "labels": labels})
    logits = model(input_ids=input_ids).logits
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


def test_models_under_every_wrapper_project_only_the_targets() -> None:
    """`keeps_logits` sees the causal LM under DDP's or DeepSpeed's `.module`, PEFT, and the class
    FSDP2's `fully_shard` swaps in (made as torch makes it: a subclass of the model's in torch's
    own module); a model whose forward has no `logits_to_keep` gets every position's logits."""
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FSDPModule
    from transformers import LlamaConfig, LlamaForCausalLM

    from eft.training.steps import keeps_logits

    def tiny() -> LlamaForCausalLM:
        return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))

    class Wrapper(torch.nn.Module):  # DDP and DeepSpeed's engine hold the model as `.module`
        def __init__(self, module: torch.nn.Module):
            super().__init__()
            self.module = module

    sharded = tiny()
    sharded.__class__ = type(f"FSDP{LlamaForCausalLM.__name__}", (FSDPModule, LlamaForCausalLM), {})
    sharded.__class__.__module__ = FSDPModule.__module__
    peft = get_peft_model(tiny(), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert all(keeps_logits(m) for m in (tiny(), Wrapper(tiny()), peft, Wrapper(peft), sharded))

    class Plain(torch.nn.Module):
        def forward(self, input_ids):  # noqa: ANN001, ANN202
            return input_ids

    assert not keeps_logits(Plain()) and not keeps_logits(Wrapper(Plain()))
