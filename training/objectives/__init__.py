"""What a job's training minimises. The training loop (`training/loop.py`) has one life for every
objective: setup, batching, optimizer steps, syncs, checkpoints, preemption, resize, pause, and
when to evaluate. What an objective computes is asked of it through `Objective`: what a record
trains as, what the loss is a mean over, a micro-batch's loss and metric sums, the reference it
needs. A new objective is a new module here and a line in `for_config`, not branches in the loop.

- `sft.py`: supervised fine-tuning, the mean cross-entropy over the trained tokens.
- `dpo.py`: preference tuning (DPO) over pairs of replies, against a reference model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:
    import torch

    from eft.training.config import TrainConfig
    from eft.training.data import Example


class Objective(Protocol):
    #: The metrics a micro-batch's loss returns sums of besides the loss (each reported as a
    #: mean over the same units as the loss, `eval_<name>` for evaluations).
    metrics: tuple[str, ...]
    #: How many sequences one record trains as (packing budgets a record whole).
    sequences_per_record: int

    def units(self, records: Sequence[Any]) -> float:
        """What the loss of `records` is a mean over: trained tokens, or pairs."""

    def sequences(self, records: Sequence[Any]) -> list[Example]:
        """The sequences `records` train as, in the order the loss reads them."""

    def prompt_examples(self, records: Sequence[Any]) -> list[Example]:
        """The examples whose prompts evaluation replies to."""

    def prepare(self, strategy: Any, device: torch.device) -> None:
        """After the strategy holds the model: load what the objective needs besides it."""

    def before(self, strategy: Any, batch: dict[str, Any], host_batch: dict[str, torch.Tensor]) -> Any:
        """What a micro-batch's loss needs that is computed without gradients (outside the
        strategy's accumulation), or None."""

    def loss(self, model: Any, batch: dict[str, Any], prepared: Any,
             weight: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's summed loss (with its graph) times `weight`, and its metric sums
        (detached device tensors). Called under the strategy's autocast; weight 0 is a pass that
        only joins the collectives."""


def for_config(cfg: TrainConfig) -> Objective:
    """The objective a job's config names."""
    if cfg.objective == "dpo":
        from eft.training.objectives.dpo import Preference

        return Preference(cfg)
    from eft.training.objectives.sft import TokenLoss

    return TokenLoss()
