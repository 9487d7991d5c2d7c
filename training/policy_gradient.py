"""Reinforcement fine-tuning (GRPO): group-normalised advantages over the `n` samples of a prompt,
and the token-level policy-gradient loss with the reference's KL, as TRL's `GRPOTrainer` computes
them (trl/trainer/grpo_trainer.py, `_generate_and_score_completions` and `_compute_loss`).

A step samples `n` completions of each of its prompts from the serving engine holding the current
adapter (service/serving/sampler.py), grades them, and trains once on them (on-policy: one
optimizer step per batch of rollouts, TRL's `num_iterations=1`). For sample i of a group with
rewards r,

    A_i = (r_i - mean(r)) / (std(r) + 1e-4)          (scale "group"; "batch": the batch's std;
                                                      "none": not divided, Dr. GRPO)

and for each of its completion tokens t, with logp the policy's log-probability (with gradients),
old = logp without gradients (on-policy: the ratio is 1 and only its gradient acts), ref the
reference's (the base with the adapter switched off, for LoRA) and q the sampler's,

    ratio   = exp(logp - old)
    pg      = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    is      = min(exp(old - q), is_cap)              (truncated importance sampling, TRL's
                                                      "token_truncate" mode: the engine and the
                                                      trainer compute the same distribution with
                                                      different kernels)
    kl      = exp(ref - logp) - (ref - logp) - 1     (the k3 estimator, always >= 0)
    loss_t  = pg * is + beta * kl

summed over the completion tokens of the global batch and divided by their count (TRL's "dapo"
loss type: every token weighs the same, whatever its sequence's length or its worker), which is
the training loop's mean over its units (`training/loop.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: What the loss's metric sums are of (each reported as a mean over the completion tokens).
POLICY_METRICS = ("kl", "clipped", "is_weight")
SCALES = ("group", "batch", "none")


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """The advantage of each sample: its reward less its group's mean, divided by the group's
    standard deviation (`scale="group"`), the whole batch's ("batch") or nothing ("none").
    `rewards` [groups * group_size] lists each prompt's samples together; fp32 out."""
    import torch

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, not {scale!r}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not whole groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
        advantages = advantages / (std.expand_as(grouped).reshape(-1) + 1e-4)
    elif scale == "batch":
        std = rewards.float().std() if rewards.numel() > 1 else rewards.new_zeros(())
        advantages = advantages / (std + 1e-4)
    return advantages


def token_losses(logps: torch.Tensor, sampler_logps: torch.Tensor, advantages: torch.Tensor,
                 ref_logps: torch.Tensor | None = None, *, beta: float = 0.0, eps_low: float = 0.2,
                 eps_high: float = 0.2, is_cap: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per completion token: the loss (see the module docstring) and the metric sums of
    POLICY_METRICS. Every argument is a 1-D tensor over the same tokens (each token carries its
    sequence's advantage); `ref_logps` is needed when `beta` is not 0."""
    import torch

    old = logps.detach()
    ratio = torch.exp(logps - old)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    pg = -torch.min(ratio * advantages, clipped_ratio * advantages)
    is_weight = torch.clamp(torch.exp(old - sampler_logps), max=is_cap)
    loss = pg * is_weight
    if beta:
        if ref_logps is None:
            raise ValueError("a KL coefficient needs the reference's log-probabilities")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + beta * kl
        kl_sum = kl.detach().sum()
    else:
        kl_sum = logps.new_zeros(()) if ref_logps is None else (
            torch.exp(ref_logps - old) - (ref_logps - old) - 1).sum()
    # Where the clip binds (TRL's clip_ratio/region_mean): below 1 - eps_low on a negative advantage,
    # above 1 + eps_high on a positive one.
    ratio = ratio.detach()
    binds = ((ratio < 1 - eps_low) & (advantages < 0)) | ((ratio > 1 + eps_high) & (advantages > 0))
    return loss, {"kl": kl_sum, "clipped": binds.float().sum(), "is_weight": is_weight.sum()}
