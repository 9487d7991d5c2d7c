"""Rollouts of reinforcement fine-tuning: a step's prompts sampled `n` times each from the serving
engine holding the current policy, graded, and turned into what the policy-gradient loss trains on
(training/policy_gradient.py).

- A prompt is a dataset row in OpenAI's reinforcement shape: a chat whose last message is the
  user's, rendered with the model's chat template and its generation prompt exactly as the model
  servers render a chat (training/chat.py), and the row itself as the graders' `{{ item }}`.
- The sampler is the model servers' engine in a Ray actor (service/serving/sampler.py), reached by
  its handle (a Ray Train worker gets it by name): `sample(prompt ids, n, max_tokens, temperature,
  top_p, seed, adapter)` returns per prompt `n` samples with their token ids and the sampling
  distribution's log-probabilities. Prompt i of a call samples with seed `seed + i`, so a step's
  samples are a function of (the job's seed, the step, the prompt's place in the step): a resumed
  run samples the step again with the same seeds.
- Graders score each reply against its row (training/graders, `grade_many`: a python grader runs
  the whole step's replies in one sandboxed process); advantages are normalised within each
  prompt's group.
- A rollout is an `Example` (prompt + completion; the completion tokens are the labels) with the
  sampler's log-probability of each completion token and its group advantage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from eft.training.chat import prepare_messages, render
from eft.training.data import IGNORE_INDEX, Example


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    item: Mapping[str, Any]


@dataclass(frozen=True)
class Rollout(Example):
    """One sampled reply as a training sequence: `labels` are the completion's tokens."""

    sampler_logprobs: list[float] = field(default_factory=list)
    advantage: float = 0.0
    reward: float = 0.0


@dataclass(frozen=True)
class StepRollouts:
    rollouts: list[Rollout]
    #: Sums over the step's replies (reward, reward squared, passed, completion tokens, truncated)
    #: and their count, for the step's metrics.
    sums: dict[str, float]


def prompt_of(row: Mapping[str, Any], tokenizer: Any, system_message: str = "keep") -> Prompt:
    """The row's chat rendered up to the assistant's turn, as the model servers render it."""
    text = render(tokenizer, prepare_messages(list(row["messages"]), system_message), add_generation_prompt=True)
    return Prompt(list(tokenizer(text, add_special_tokens=False)["input_ids"]), row)


def sample(sampler: Any, prompts: Sequence[Prompt], *, n: int, max_tokens: int, temperature: float,
           top_p: float, seed: int, adapter: Mapping[str, str] | None) -> list[list[dict[str, Any]]]:
    """`n` samples of each prompt from `sampler` (an actor handle), the policy `adapter`
    (`{"model", "location", "kind"}`; None: the base model)."""
    import ray

    return ray.get(sampler.sample.remote([p.ids for p in prompts], n=n, max_tokens=max_tokens,
                                         temperature=temperature, top_p=top_p, seed=seed,
                                         adapter=dict(adapter) if adapter else None))


def grade_groups(prompts: Sequence[Prompt], groups: Sequence[Sequence[Mapping[str, Any]]], grader: Mapping[str, Any],
                 *, scale: str = "group", pass_threshold: float = 1.0, judge: Any = None) -> StepRollouts:
    """The rollouts of `groups` (per prompt, its samples) graded by `grader`: rewards, group
    advantages, and the step's metric sums."""
    import torch

    from eft.training.graders import grade_many
    from eft.training.policy_gradient import group_advantages

    sizes = {len(group) for group in groups}
    if len(sizes) != 1:
        raise ValueError(f"every prompt needs the same number of samples, got {sorted(sizes)}")
    n = sizes.pop()
    flat = [(prompt, sample) for prompt, group in zip(prompts, groups) for sample in group]
    rewards = [result.score for result in grade_many(grader, [(s["text"], p.item) for p, s in flat], judge=judge)]
    advantages = group_advantages(torch.tensor(rewards), n, scale).tolist()
    rollouts, sums = [], {"reward": 0.0, "reward_sq": 0.0, "passed": 0.0, "completion_tokens": 0.0,
                          "truncated": 0.0, "replies": 0.0}
    for (prompt, sample_), reward, advantage in zip(flat, rewards, advantages):
        completion = list(sample_["token_ids"])
        rollouts.append(Rollout(input_ids=prompt.ids + completion, labels=[IGNORE_INDEX] * len(prompt.ids) + completion,
                                sampler_logprobs=list(sample_["logprobs"]), advantage=float(advantage),
                                reward=float(reward)))
        sums["reward"] += reward
        sums["reward_sq"] += reward * reward
        sums["passed"] += float(reward >= pass_threshold)
        sums["completion_tokens"] += len(completion)
        sums["truncated"] += float(sample_.get("finish_reason") == "length")
        sums["replies"] += 1
    return StepRollouts(rollouts, sums)


def summary(sums: Mapping[str, float]) -> dict[str, float]:
    """The step's metrics from its sums: reward mean and spread, pass rate, reply length, the
    share of replies cut at `max_tokens`."""
    count = max(1.0, sums["replies"])
    mean = sums["reward"] / count
    return {"reward_mean": mean, "reward_std": max(0.0, sums["reward_sq"] / count - mean * mean) ** 0.5,
            "pass_rate": sums["passed"] / count, "response_length": sums["completion_tokens"] / count,
            "truncated_rate": sums["truncated"] / count}

