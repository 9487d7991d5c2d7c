"""What one optimizer step is made of, apart from the loop that runs it: the learning-rate
schedule, the token loss of a micro-batch, and the memory readings each report carries."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from eft.training.config import TrainConfig


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


def token_loss_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of next-token cross-entropy over the target tokens of a micro-batch (fp32)."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    logits = model(**inputs, use_cache=False).logits  # no KV cache in training
    shift_logits = logits[:, :-1, :].float().flatten(0, 1)
    shift_labels = batch["labels"][:, 1:].flatten()
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
