"""The GPU path of a packed micro-batch, checked without a GPU: on the meta device.

Tensors on the meta device have shapes and no values, so every operation that would read a
device value on the host (a host-device sync on a GPU: `.item()`, `.tolist()`, `nonzero`, a
boolean index, a Python `if` on a tensor) raises there; torch's fake kernel stands in for
flash-attention's varlen kernel. The model, its LoRA adapters and the micro-batch's device
inputs live on the meta device, the host side of the batch (the examples' boundaries, the kept
loss positions) is real, as the training loop builds it. A dispatch mode counts what runs.
`make gpu-check` runs the same path on a real GPU (`test_packing.py`'s bf16 CUDA row).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eft.training.attention import register
from eft.training.data import IGNORE_INDEX, Example
from eft.training.packing import collate_packed, packed_inputs, packed_targets
from eft.training.steps import token_cross_entropy_sum, token_loss_sum

META = torch.device("meta")
LAYERS = 3


class Ops(TorchDispatchMode):
    """Counts the ATen operations that run (views included) and keeps the varlen calls' args."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.varlen: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.counts[name] += 1
        if name == "torch_attn._varlen_attn":
            self.varlen.append(args)
        return func(*args, **(kwargs or {}))

    def attention_calls(self) -> dict[str, int]:
        return {name: n for name, n in self.counts.items() if "attn" in name or "scaled_dot_product" in name}


def meta_model(sliding_window: int | None = None, lora: bool = True) -> torch.nn.Module:
    """A Llama (or a Mistral with a sliding window) from config on the meta device, bf16, with
    grouped-query attention, under the packed kernel a job with sdpa attention runs."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    register()
    dims = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                attn_implementation="eft_packed")
    with META:
        if sliding_window is None:
            model = LlamaForCausalLM(LlamaConfig(**dims))
        else:
            model = MistralForCausalLM(MistralConfig(sliding_window=sliding_window, **dims))
    model = model.to(torch.bfloat16)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    return model


def micro_batch(lengths: list[int], seed: int = 0) -> dict:
    rng = random.Random(seed)
    examples = []
    for n in lengths:
        prompt = rng.randrange(1, n // 2 + 1)
        ids = [rng.randrange(1, 512) for _ in range(n)]
        examples.append(Example(ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    host = collate_packed(examples, 0)
    return {**packed_inputs(host, META, "sdpa"), **packed_targets(host, META)}


def test_one_varlen_call_per_layer_and_no_per_example_attention() -> None:
    """Each micro-batch runs one varlen attention call per layer forward and one backward,
    whatever its number of examples and lengths: no SDPA call, so no new SDPA shape ever (the
    per-example CPU path makes one call per example and layer, each a shape of its own)."""
    model = meta_model()
    for step, lengths in enumerate(([50, 120, 33, 77], [300, 7, 64, 64, 9, 200, 41, 18], [1000])):
        with Ops() as ops:
            token_loss_sum(model, micro_batch(lengths, seed=step)).backward()
        assert ops.attention_calls() == {"torch_attn._varlen_attn": LAYERS, "torch_attn._varlen_attn_backward": LAYERS}
        for args in ops.varlen:
            q, k, v, cu_q, cu_k, max_q, max_k = args[:7]
            assert q.shape == (sum(lengths), 4, 32) and k.shape[1] == v.shape[1] in (2, 4)
            assert cu_q.device == META and cu_q.dtype == torch.int32 and cu_q.shape == (len(lengths) + 1,)
            assert max_q == max_k == max(lengths)


def test_sliding_window_goes_to_the_kernel() -> None:
    """A Mistral's window becomes the kernel's (left, right) window, keys within q - kv < window."""
    model = meta_model(sliding_window=16, lora=False)
    with Ops() as ops:
        token_loss_sum(model, micro_batch([40, 30, 10])).backward()
    assert ops.attention_calls()["torch_attn._varlen_attn"] == LAYERS
    assert all(list(args[9]) == [15, 0] for args in ops.varlen)  # window_size: 15 back, none ahead


def test_a_packed_micro_batch_never_reads_the_device() -> None:
    """Forward, loss and backward of a packed micro-batch with LoRA complete on the meta device:
    no operation read a device value on the host. The same batch without what the collator
    computed on the host does read one (the meta device raises), so the check can fail."""
    model = meta_model()
    batch = micro_batch([50, 120, 33, 77, 9])
    loss = token_loss_sum(model, batch)
    loss.backward()
    assert loss.device == META and loss.shape == ()
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters() if p.requires_grad)

    without_kept_positions = {k: v for k, v in batch.items() if k not in ("keep", "targets")}
    with pytest.raises(NotImplementedError, match="nonzero"):  # a boolean logits_to_keep: nonzero
        token_loss_sum(model, without_kept_positions)
    without_row_mask = {k: v for k, v in batch.items() if k != "attention_mask"}
    with pytest.raises(RuntimeError, match="item"):  # transformers looks for packing in the position ids
        token_loss_sum(model, without_row_mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_loss_launches_at_most_50_operations_per_micro_batch(dtype: torch.dtype) -> None:
    """The loss of a 16k-token micro-batch at a 32k vocabulary, forward and backward, in at most
    50 operations on an accelerator (about a dozen per chunk, at most 4 chunks), views aside."""
    tokens, vocab = 16_384, 32_000
    logits = torch.empty(tokens, vocab, device=META, dtype=dtype, requires_grad=True)
    targets = torch.empty(tokens, device=META, dtype=torch.long)
    with Ops() as ops:
        token_cross_entropy_sum(logits, targets, all_targeted=True).backward()
    views = {"view", "slice", "unsqueeze", "squeeze", "expand", "t", "transpose", "as_strided", "detach", "alias"}
    launched = sum(n for name, n in ops.counts.items() if name.split(".")[-1] not in views)
    assert launched <= 50, ops.counts
    assert ops.counts["aten.gather"] == 4  # four chunks


def test_lora_layers_under_autocast_keep_the_activations_dtype() -> None:
    """bf16 base, fp32 adapters under autocast (DDP's mixed precision): PEFT's cast of every
    adapted layer's input to fp32, which autocast casts back for the product, is switched off.
    Fewer casts, the same logits (autocast runs the adapters' products in bf16 either way)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from eft.training.lora import keep_activation_dtype

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)).to(torch.bfloat16)
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    ids = torch.randint(1, 97, (1, 24))

    def forward() -> tuple[torch.Tensor, int]:
        with Ops() as ops, torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids, use_cache=False).logits
        return logits, ops.counts["aten._to_copy"]

    before, casts_before = forward()
    assert keep_activation_dtype(model) == 14  # 7 linear layers a block, 2 blocks
    after, casts_after = forward()
    assert casts_after <= casts_before - 14  # at least one cast of an activation less per adapted layer
    torch.testing.assert_close(after, before, rtol=0, atol=0)
