"""The GRPO pieces (training/policy_gradient.py) against TRL's formulas on fixed rollouts: the
group-normalised advantages, and the token-level loss and its gradient as TRL's `GRPOTrainer`
computes them for its "dapo" loss type (padded [sequences, tokens] with a mask there, the
completion tokens flattened here)."""

from __future__ import annotations

import math

import pytest
import torch

from eft.training.policy_gradient import group_advantages, token_losses


def test_advantages_are_each_groups_rewards_centred_and_scaled_as_trl_does():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 1.0])
    got = group_advantages(rewards, 4)
    # TRL: rewards.view(-1, G); mean and (unbiased) std per group, repeated; (r - mean) / (std + 1e-4).
    expected = []
    for group in rewards.view(-1, 4).tolist():
        mean = sum(group) / 4
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 3)
        expected += [(r - mean) / (std + 1e-4) for r in group]
    torch.testing.assert_close(got, torch.tensor(expected))
    assert got[4:8].abs().max() == 0  # a group that all scored the same teaches nothing
    assert got[:4].sum().abs() < 1e-5 and got[0] > 0 > got[1]
    # Dr. GRPO's: centred, not scaled; "batch": one std for the whole batch.
    torch.testing.assert_close(group_advantages(rewards, 4, "none"),
                               rewards - rewards.view(-1, 4).mean(1).repeat_interleave(4))
    torch.testing.assert_close(group_advantages(rewards, 4, "batch"),
                               group_advantages(rewards, 4, "none") / (rewards.std() + 1e-4))
    with pytest.raises(ValueError, match="whole groups"):
        group_advantages(rewards[:10], 4)


def _trl_dapo(logps, old, ref, sampler, advantages, mask, beta, eps_low, eps_high, cap):
    """TRL 1.16's `_compute_loss` for loss_type "dapo", one process, no accumulation, with its
    vLLM importance-sampling correction (truncated at `cap`), on padded [B, T] tensors."""
    coef_1 = torch.exp(logps - old)
    per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages[:, None], coef_2 * advantages[:, None])
    per_token_loss = per_token_loss * torch.clamp(torch.exp(old - sampler), max=cap)
    per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss * mask).sum() / mask.sum()


def test_the_token_loss_and_its_gradient_equal_trls_dapo_loss_on_fixed_rollouts():
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 2, 7, 4, 3, 6]  # six completions of different lengths, two groups of three
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    base = -torch.rand(len(lengths), width, generator=generator) * 3
    ref = base - torch.rand(base.shape, generator=generator) * 0.3
    sampler = base + (torch.rand(base.shape, generator=generator) - 0.5) * 0.4  # the engine's own kernels
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0]), 3)
    beta = 0.04

    padded = base.clone().requires_grad_(True)
    expected = _trl_dapo(padded, padded.detach(), ref, sampler, advantages, mask, beta, 0.2, 0.28, 2.0)
    expected.backward()

    keep = mask.bool()
    flat = base[keep].clone().requires_grad_(True)
    per_token = advantages[:, None].expand_as(base)[keep]
    losses, sums = token_losses(flat, sampler[keep], per_token, ref[keep], beta=beta, eps_low=0.2, eps_high=0.28,
                                is_cap=2.0)
    got = losses.sum() / keep.sum()  # the loop's mean over its units: the batch's completion tokens
    got.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(flat.grad, padded.grad[keep])
    assert padded.grad[~keep].abs().max() == 0
    # The metrics: the KL to the reference, the clipped tokens (none on-policy), the IS weights.
    kl = torch.exp(ref - base) - (ref - base) - 1
    torch.testing.assert_close(sums["kl"], kl[keep].sum())
    assert sums["clipped"] == 0
    torch.testing.assert_close(sums["is_weight"], torch.clamp(torch.exp(base - sampler), max=2.0)[keep].sum())


def test_without_a_kl_coefficient_the_gradient_is_the_advantage_weighted_log_likelihoods():
    logps = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    advantages = torch.tensor([1.0, 1.0, -2.0])
    losses, sums = token_losses(logps, logps.detach(), advantages)  # sampler = trainer: IS weight 1
    losses.sum().backward()
    torch.testing.assert_close(logps.grad, -advantages)  # d(-A * ratio)/dlogp at ratio 1
    assert sums["kl"] == 0 and sums["is_weight"] == 3
    with pytest.raises(ValueError, match="reference"):
        token_losses(logps, logps.detach(), advantages, beta=0.1)
