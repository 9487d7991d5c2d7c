"""What one optimizer step is made of, apart from the loop that runs it: the learning-rate
schedule, the token loss of a micro-batch, and the memory readings each report carries."""

from __future__ import annotations

import functools
import math

import torch

from eft.training.config import TrainConfig
from eft.training.data import IGNORE_INDEX


def lr_lambda(cfg: TrainConfig):
    """Multiplier of the peak learning rate at each optimizer step: warmup, then decay."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_scheduler == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps)
        progress = min(1.0, progress)
        if cfg.lr_scheduler == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def peak_memory_gb(device: torch.device) -> float:
    """This worker's peak memory in GB (10^9 bytes, the planner's unit): the CUDA allocator's
    peak on a GPU, the process's peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return host_peak_memory_gb()


def host_peak_memory_gb() -> float:
    """This process's peak resident set size in GB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is KiB


#: The model inputs a micro-batch may carry: padded (attention_mask) or packed (position ids and
#: the examples' boundaries, see training/packing.py).
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids",
                "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


#: fp32 values (chunk tokens x vocabulary) the loss works on at a time on the CPU: 8M, about
#: 100 MB of temporaries whatever the micro-batch and the vocabulary. The planner counts the same
#: chunk (`eft.planner.memory.loss_chunk_tokens`).
LOSS_CHUNK_ELEMENTS = 1 << 23
#: On an accelerator, at most this many chunks per micro-batch: each chunk is about a dozen
#: kernel launches of a few microseconds of work, so small chunks would leave the device waiting
#: on the host. A chunk's fp32 copy is then up to a quarter of the kept tokens' logits in fp32
#: (the bf16 logits and their gradient take 4 bytes per token and vocabulary entry, the chunk 1).
LOSS_DEVICE_CHUNKS = 4


def loss_chunk_tokens(vocab_size: int, tokens: int = 0, device: str = "cpu") -> int:
    """Tokens per loss chunk: on the CPU 65 for Llama 3's 128k vocabulary, at least 64; on an
    accelerator also at least a `LOSS_DEVICE_CHUNKS`-th of the micro-batch's `tokens`."""
    chunk = max(64, LOSS_CHUNK_ELEMENTS // max(1, vocab_size))
    if device != "cpu":
        chunk = max(chunk, -(-tokens // LOSS_DEVICE_CHUNKS))
    return chunk


def _chunks(logits: torch.Tensor, labels: torch.Tensor, chunk: int, losses: torch.Tensor,
            grad: torch.Tensor | None, all_targeted: bool) -> None:
    """Write each row's loss to `losses` and its gradient to `grad` (when given), a chunk of rows
    at a time. With `all_targeted` (the caller kept only target positions) no row is masked.

    The softmax is built in one fp32 buffer per chunk: the gradient's own rows when the logits
    are fp32, else an upcast copy of the chunk. The logits are never written to (the model may
    have saved them for its backward: Gemma 2's soft-capping does). About a dozen operations a
    chunk, none reading a value on the host."""
    minus_one = torch.full((1, 1), -1.0, device=logits.device).expand(chunk, 1) if grad is not None else None
    for start in range(0, logits.shape[0], chunk):
        rows = logits[start:start + chunk]
        y = labels[start:start + chunk]
        n = rows.shape[0]
        if not all_targeted:
            targeted = y != IGNORE_INDEX
            y = y.masked_fill(~targeted, 0)
        if grad is not None and grad.dtype == torch.float32 and rows.dtype == torch.float32:
            work = torch.sub(rows, rows.amax(dim=-1, keepdim=True), out=grad[start:start + n])
        else:
            work = rows.to(torch.float32, copy=True)
            work.sub_(work.amax(dim=-1, keepdim=True))
        picked = work.gather(1, y[:, None])  # the target's logit, less the row's peak
        sums = work.exp_().sum(dim=-1, keepdim=True)
        row_losses = torch.sub(sums.log(), picked, out=losses[start:start + n, None])
        if not all_targeted:
            # where, not a product: a row that is not a target may hold inf (0 * inf is NaN)
            row_losses.masked_fill_(~targeted[:, None], 0.0)
        if grad is not None:
            # d(sum of -log softmax[y]) / dz = softmax(z) - onehot(y), on targeted rows only.
            work.div_(sums)
            work.scatter_add_(1, y[:, None], minus_one[:n])
            if not all_targeted:
                work.masked_fill_(~targeted[:, None], 0.0)
            if work.data_ptr() != grad[start:start + n].data_ptr():
                grad[start:start + n].copy_(work)


class _TokenCrossEntropySum(torch.autograd.Function):
    """Sum of cross-entropy over the targeted rows of `logits` [N, V], in chunks of rows.

    Each chunk is upcast to fp32 and its loss and gradient computed at once; the gradient goes
    to one buffer (in the logits' dtype; fp32 for fp16 logits), which backward scales in place.
    So fp32 logits and softmax exist for one chunk at a time, and the loss's peak is the logits
    and their gradient: per token and vocabulary entry 4 bytes in bf16 plus one chunk's fp32
    copy, 6 in fp16, 8 in fp32, where `F.cross_entropy(logits.float())` keeps the fp32 copy and
    log-softmax of the whole micro-batch and builds their gradients in backward (12). The sum
    and the gradient are those of `F.cross_entropy(logits.float(), labels, ignore_index=-100,
    reduction="sum")`.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk: int, all_targeted: bool) -> torch.Tensor:
        needs_grad = ctx.needs_input_grad[0]
        # fp16 would flush small probabilities to zero before the loss scale lifts them: its
        # gradient is kept in fp32 (bf16 has fp32's range).
        grad_dtype = torch.float32 if logits.dtype == torch.float16 else logits.dtype
        grad = torch.empty_like(logits, dtype=grad_dtype) if needs_grad else None
        ctx.logits_dtype = logits.dtype
        losses = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        with _autocast_off(logits.device.type):
            _chunks(logits, labels, chunk, losses, grad, all_targeted)
        ctx.save_for_backward(grad)
        return losses.sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # One rounding: the scale (the loss scale, 1 / tokens) multiplies in fp32.
        return grad.mul_(grad_output).to(ctx.logits_dtype), None, None, None


def _autocast_off(device_type: str):
    import contextlib

    if not torch.amp.is_autocast_available(device_type):  # the meta device, where the device path is checked
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def token_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, chunk: int | None = None,
                            all_targeted: bool = False) -> torch.Tensor:
    """Sum of cross-entropy over the targeted positions: `logits` [..., V] predict `labels`
    [...] (-100: not a target; with `all_targeted` the caller promises there is none), computed
    chunk by chunk (`_TokenCrossEntropySum`)."""
    logits = logits.reshape(-1, logits.shape[-1])
    chunk = chunk or loss_chunk_tokens(logits.shape[-1], logits.shape[0], logits.device.type)
    return _TokenCrossEntropySum.apply(logits, labels.reshape(-1), chunk, all_targeted)


def token_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of next-token cross-entropy over the target tokens of a micro-batch (fp32).

    The model projects only the hidden states of positions that predict a target onto the
    vocabulary (transformers' `logits_to_keep`: the positions a packed row's collator found, a
    boolean mask for a padded batch): a prompt, a masked turn or
    an example's last token costs no output projection, no logits and no softmax. On a chat set
    that trains the answers only, that is often half of the positions; the output projection is
    a fifth of a 1B model's weights (Llama 3.2 1B, Qwen2.5 0.5B: more)."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if "keep" in batch:
        # A packed row: the positions that predict a target and their targets, found by the
        # collator on the host (`training/packing.py:collate_packed`), so nothing here waits
        # for the device.
        keep = batch["keep"]
        if keeps_logits(model):
            logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits  # [1, kept, V]
        else:
            logits = model(**inputs, use_cache=False).logits[0].index_select(0, keep)
        return token_cross_entropy_sum(logits, batch["targets"], all_targeted=True)
    targets = next_token_targets(batch["labels"])
    if keeps_logits(model):
        keep = targets != IGNORE_INDEX
        logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits  # [kept, V]
        return token_cross_entropy_sum(logits, targets[keep])
    logits = model(**inputs, use_cache=False).logits  # no KV cache in training
    return token_cross_entropy_sum(logits, targets)


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """What each position predicts: position t the label at t + 1 (-100 at each row's end). The
    labels are shifted, not the logits: a slice of the logits would cost a zero-filled copy of
    their whole gradient in backward."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model under its wrappers (DDP, DeepSpeed, PEFT) takes a boolean
    `logits_to_keep` mask: transformers' causal LMs do (`slice_logits_to_keep`); a model whose
    forward has no such argument computes every position's logits."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DDP, DeepSpeed's engine
        model = model.module
    if hasattr(model, "get_base_model"):  # PEFT
        model = model.get_base_model()
    return _forward_keeps_logits(type(model))


@functools.cache
def _forward_keeps_logits(cls: type) -> bool:
    import inspect
    import sys

    if "logits_to_keep" not in inspect.signature(cls.forward).parameters:
        return False
    # The boolean mask came with `slice_logits_to_keep`; a model that slices by itself would
    # read a mask as positions. The module of the forward, not of the class: FSDP2 swaps in a
    # class of its own making (`FSDPLlamaForCausalLM`) that inherits the model's forward.
    module = sys.modules.get(cls.forward.__module__)
    return module is not None and hasattr(module, "slice_logits_to_keep")
