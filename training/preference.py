"""Preference tuning (DPO): pairs of replies to one prompt, and the loss that prefers one.

A record has the shape OpenAI, Together and Fireworks share::

    {"input": {"messages": [...], "tools": [...]},
     "preferred_output": [{"role": "assistant", "content": ...}],
     "non_preferred_output": [{"role": "assistant", "content": ...}]}

Each reply is appended to the prompt's messages and the conversation rendered with the model's
own chat template, exactly as a chat record is for supervised training (`training/chat.py`); the
trained tokens are the final assistant turn's. So a pair is two `Example`s, chosen and rejected,
that share the prompt's tokens. Each part lives in its layer: the record's schema in
`training/formats.py`, its tokenisation (`Pair`, `tokenize_preference`) in `training/data.py`, and
the loss here.

The loss is DPO's (Rafailov et al. 2023) in its sigmoid form, as TRL's `DPOTrainer` computes it:
with pi and ref the summed log-probabilities of a reply's trained tokens under the policy and the
reference model, and beta the strength of the pull towards the reference,

    loss = -log sigmoid(beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected)))

averaged over the pairs of the global batch. The rewards are beta * (pi - ref) per reply. The
reference of a LoRA or QLoRA job is the base model itself (the adapter switched off for one
forward pass without gradients: no second copy), of a full fine-tune a frozen copy of the base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from eft.training.data import IGNORE_INDEX, Example, Pair

if TYPE_CHECKING:
    import torch

# --- the loss --------------------------------------------------------------------------------


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, bounds: Sequence[tuple[int, int, int]]) -> torch.Tensor:
    """Summed log-probability of each sequence's trained tokens: `logits` [rows, T, V] predict
    `labels` [rows, T] shifted by one; `bounds` lists each sequence as (row, start, end) within
    the rows (a padded batch: one whole row each; a packed row: the examples' boundaries).

    Each sequence's sum goes through the chunked cross-entropy of supervised training
    (`steps.token_cross_entropy_sum`), so full-vocabulary fp32 log-probabilities never exist."""
    import torch

    from eft.training.steps import next_token_targets, token_cross_entropy_sum

    targets = next_token_targets(labels)
    return torch.stack([-token_cross_entropy_sum(logits[row, start:end], targets[row, start:end])
                        for row, start, end in bounds])


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses and the chosen and rejected rewards (detached), all fp32 [pairs]."""
    import torch.nn.functional as F

    chosen = policy_chosen.float() - ref_chosen.float()
    rejected = policy_rejected.float() - ref_rejected.float()
    losses = -F.logsigmoid(beta * (chosen - rejected))
    return losses, (beta * chosen).detach(), (beta * rejected).detach()


def pair_sequences(pairs: Sequence[Pair]) -> list[Example]:
    """The micro-batch's sequences in the order the loss reads them: every chosen, then every
    rejected (so the first half of the log-probabilities are the chosen ones)."""
    return [p.chosen for p in pairs] + [p.rejected for p in pairs]


@dataclass(frozen=True)
class Sequences:
    """Where a collated micro-batch's sequences are: `bounds` (row, start, end) within its rows,
    and `targets`, each sequence's positions that predict a trained token as a (start, end) span
    of all such positions in row-major order (the rows of the logits the model keeps)."""

    bounds: list[tuple[int, int, int]]
    targets: list[tuple[int, int]]


def sequence_bounds(batch: dict[str, torch.Tensor]) -> Sequences:
    """The sequences of a collated batch on the host: the packed boundaries of its one row, or
    each padded row whole."""
    from eft.training.steps import next_token_targets

    rows, length = batch["input_ids"].shape
    if "cu_seq_lens" in batch:
        cuts = batch["cu_seq_lens"].tolist()
        bounds = [(0, cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    else:
        bounds = [(row, 0, length) for row in range(rows)]
    # Targeted positions before each flat position: the spans are differences of it.
    before = (next_token_targets(batch["labels"]) != IGNORE_INDEX).flatten().cumsum(0).tolist()
    before.insert(0, 0)
    return Sequences(bounds, [(before[row * length + start], before[row * length + end])
                              for row, start, end in bounds])


#: Metrics of a DPO step, summed over the pairs (the loop divides by the pair count).
PAIR_METRICS = ("rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy")


def micro_batch_loss(policy: torch.Tensor, reference: torch.Tensor, beta: float,
                     weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A micro-batch's summed DPO loss (with its graph) and the sums of its pair metrics
    (detached device tensors: read only at reports), from the sequences' log-probabilities under
    the policy and the reference in `pair_sequences` order. `weight` 0 makes a pass that only
    joins the collectives."""
    n = policy.shape[0] // 2
    losses, chosen, rejected = dpo_loss(policy[:n], policy[n:], reference[:n], reference[n:], beta)
    margin = chosen - rejected
    sums = {"rewards_chosen": chosen.sum() * weight, "rewards_rejected": rejected.sum() * weight,
            "reward_margin": margin.sum() * weight, "reward_accuracy": (margin > 0).float().sum() * weight}
    return losses.sum() * weight, sums


def pair_logps(model: Any, batch: dict[str, Any], sequences: Sequences) -> torch.Tensor:
    """Summed log-probabilities of a collated micro-batch's sequences (`pair_sequences` order)
    under `model`, on the device. The model projects only the positions that predict a trained
    token (`steps.token_loss_sum`): the pair's shared prompt costs no logits."""
    import torch

    from eft.training.steps import MODEL_INPUTS, keeps_logits, next_token_targets, token_cross_entropy_sum

    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if not keeps_logits(model):
        logits = model(**inputs, use_cache=False).logits
        return sequence_logps(logits, batch["labels"], sequences.bounds)
    targets = next_token_targets(batch["labels"])
    keep = targets != IGNORE_INDEX
    logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits  # [kept, V]
    targets = targets[keep]
    return torch.stack([-token_cross_entropy_sum(logits[start:end], targets[start:end])
                        for start, end in sequences.targets])
