"""Evaluation during and at the end of a job's training, in every Ray Train worker: the
objective's loss over the validation set (sharded over ranks), the best loss and its step (and,
with publish "best", that step's trainable weights), early stopping with a patience, greedy
replies to a few validation prompts sent to the job, and what of this a checkpoint keeps so that
a resumed run goes on with it. The training loop (`training/loop.py`) decides when."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from eft.training import checkpoint
from eft.training.checkpoint import BEST_FILE
from eft.training.collectives import all_reduce_sum
from eft.training.config import TrainConfig
from eft.training.data import IGNORE_INDEX, collate, shard_for_rank
from eft.training.objectives import Objective


def sample_prompts(examples: list[Any], count: int) -> list[tuple[list[int], list[int]]]:
    """The prompts of the first `count` examples with a trained token, as (tokens before the
    first trained one, the trained run that follows: the reference reply)."""
    out = []
    for example in examples:
        if len(out) >= count:
            break
        start = next((i for i, t in enumerate(example.labels) if t != IGNORE_INDEX and i > 0), None)
        if start is None:
            continue
        end = next((i for i in range(start, len(example.labels)) if example.labels[i] == IGNORE_INDEX),
                   len(example.labels))
        out.append((list(example.input_ids[:start]), list(example.input_ids[start:end])))
    return out


class Evaluation:
    """One worker's evaluations of a job (every rank evaluates at the same steps; the losses are
    reduced, so every rank decides alike)."""

    def __init__(self, cfg: TrainConfig, objective: Objective, rank: int, world_size: int,
                 device: torch.device, sink: Any = None):
        self.cfg, self.objective, self.sink = cfg, objective, sink
        self.rank, self.world_size, self.device = rank, world_size, device
        # The best validation loss so far and its step, evaluations in a row without a better
        # one, and (publish "best", rank 0) that step's trainable weights.
        self.best_eval_loss, self.best_step, self.bad_evals = math.inf, 0, 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.stopped_early = False
        self.last_eval_step = -1
        self.extra: dict[str, float] = {}  # the last evaluation's objective metrics

    def attach(self, strategy: Any, tokenizer: Any, pad_id: int, examples: list[Any]) -> None:
        """What the evaluations run on, once the worker set it up."""
        self.strategy, self.tokenizer, self.pad_id, self.examples = strategy, tokenizer, pad_id, examples
        self.prompts = sample_prompts(self.objective.prompt_examples(examples), self.cfg.eval_sample_prompts)

    @torch.no_grad()
    def loss(self) -> float | None:
        """The objective's mean loss over the validation set, sharded over ranks as training
        shards a batch; its mean metrics go to `extra`. None without a validation set."""
        if not self.examples:
            return None
        model = self.strategy.model
        model.eval()
        chunk = self.cfg.micro_batch_size * self.world_size
        totals = dict.fromkeys(("loss", *self.objective.metrics), 0.0)
        units = 0.0
        # Equal pass counts on every rank (sharded strategies need them); empty shares
        # run a zero-weight pass.
        for start in range(0, len(self.examples), chunk):
            part = self.examples[start : start + chunk]
            mine = [part[i] for i in shard_for_rank(list(range(len(part))), self.rank, self.world_size)]
            host = collate(self.objective.sequences(mine or part[:1]), self.pad_id)
            batch = {k: v.to(self.device) for k, v in host.items()}
            prepared = self.objective.before(self.strategy, batch, host)
            with self.strategy.autocast():
                loss_sum, sums = self.objective.loss(model, batch, prepared, 1.0 if mine else 0.0)
            if mine:
                for name, value in {"loss": loss_sum, **sums}.items():
                    totals[name] += float(value)
                units += self.objective.units(mine)
        names = list(totals)
        *reduced, units = all_reduce_sum([totals[n] for n in names] + [units], self.device)
        model.train()
        means = {name: value / max(1.0, units) for name, value in zip(names, reduced)}
        self.extra = {f"eval_{name}": means[name] for name in self.objective.metrics}
        return means["loss"]

    def during(self, step: int, metrics: dict[str, float]) -> None:
        """An evaluation in the course of training: the validation loss into `metrics`, the
        best one tracked, replies to the sample prompts sent to the job, and early stopping
        decided."""
        eval_loss = self.loss()
        if eval_loss is None:
            return
        metrics["eval_loss"] = eval_loss
        metrics.update(self.extra)
        self.track_best(step, eval_loss)
        metrics["best_eval_loss"], metrics["best_step"] = self.best_eval_loss, float(self.best_step)
        self.send_samples(step, eval_loss)
        patience = self.cfg.early_stopping_patience
        if patience and self.bad_evals >= patience:
            self.stopped_early = True
            if self.rank == 0 and self.sink is not None:
                self.sink.event.remote(
                    "early_stopped",
                    f"stopped at step {step} of {self.cfg.total_steps}: {self.bad_evals} evaluations without a "
                    f"validation loss below {self.best_eval_loss:.4f} (step {self.best_step})",
                    {"step": step, "best_step": self.best_step, "best_eval_loss": self.best_eval_loss,
                     "patience": patience})

    def at_finish(self, step: int, metrics: dict[str, float]) -> None:
        """The final evaluation into the final metrics (unless an early stop evaluated this step
        already), and which step's weights are published."""
        eval_loss = self.loss()
        if eval_loss is not None:
            metrics["eval_loss"] = eval_loss
            metrics.update(self.extra)
            if self.last_eval_step != step:
                self.track_best(step, eval_loss)
                self.send_samples(step, eval_loss)
            metrics["best_eval_loss"], metrics["best_step"] = self.best_eval_loss, float(self.best_step)
        # Alike on every rank: the best step comes from the reduced losses.
        best = self.cfg.publish == "best" and math.isfinite(self.best_eval_loss)
        metrics["published_step"] = float(self.best_step if best else step)
        metrics["stopped_early"] = float(self.stopped_early)

    def published_state(self, step: int, trainable: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weights a job publishes at its end (rank 0): the best step's with publish "best",
        else the last step's (`trainable`)."""
        if self.cfg.publish == "best" and self.best_state is not None and self.best_step != step:
            return self.best_state
        return trainable

    def track_best(self, step: int, eval_loss: float) -> None:
        self.last_eval_step = step
        if eval_loss < self.best_eval_loss - self.cfg.early_stopping_min_delta:
            self.best_eval_loss, self.best_step, self.bad_evals = eval_loss, step, 0
            if self.cfg.publish == "best":
                state = self.strategy.trainable_state()  # a collective under sharded strategies
                self.best_state = {k: v.clone() for k, v in state.items()} if self.rank == 0 else None
        else:
            self.bad_evals += 1

    def save(self, directory: Path) -> None:
        """Rank 0 adds the evaluations' state to a checkpoint, so a resumed run keeps its best
        validation loss, its patience count and (publish "best") the best weights."""
        if self.rank != 0 or not math.isfinite(self.best_eval_loss):
            return
        state = checkpoint.read_state(directory)
        state["eval"] = {"best_eval_loss": self.best_eval_loss, "best_step": self.best_step,
                         "bad_evals": self.bad_evals}
        (directory / checkpoint.STATE_FILE).write_text(json.dumps(state))
        if self.best_state is not None:
            checkpoint.save_tensors(self.best_state, directory / BEST_FILE)

    def restore(self, state: dict[str, Any], directory: Path) -> None:
        """What a checkpoint kept of the evaluations (`save`)."""
        best = state.get("eval") or {}
        self.best_eval_loss = float(best.get("best_eval_loss", math.inf))
        self.best_step, self.bad_evals = int(best.get("best_step", 0)), int(best.get("bad_evals", 0))
        # Patience ran out at the checkpoint's step (a preemption came with the stopping
        # evaluation): the resumed run trains no further.
        patience = self.cfg.early_stopping_patience
        self.stopped_early = bool(patience) and self.bad_evals >= patience
        self.last_eval_step = int(state["step"]) if self.stopped_early else -1
        if self.rank == 0 and (directory / BEST_FILE).is_file():
            self.best_state = checkpoint.load_trainable(directory, BEST_FILE)

    @torch.no_grad()
    def send_samples(self, step: int, eval_loss: float) -> None:
        """Rank 0 replies greedily to the sample prompts and sends them to the job as an
        `eval_samples` event. Only where rank 0 holds whole weights (DDP, ZeRO-1/2): under
        FSDP and ZeRO-3 a forward pass is a collective, and generation lengths differ."""
        if not self.prompts or self.rank != 0 or self.sink is None or self.cfg.strategy in ("fsdp", "zero3"):
            return
        from eft.training.chat import stop_token_ids

        model = self.strategy.module
        model.eval()
        stops = stop_token_ids(self.tokenizer, getattr(model, "generation_config", None))
        samples = []
        try:
            for prompt, reference in self.prompts:
                ids = torch.tensor([prompt], device=self.device)
                with self.strategy.autocast():
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=self.cfg.eval_sample_tokens, eos_token_id=stops,
                                         pad_token_id=self.pad_id)
                samples.append({
                    "prompt": self.tokenizer.decode(prompt, skip_special_tokens=True),
                    "reference": self.tokenizer.decode(reference, skip_special_tokens=True),
                    "reply": self.tokenizer.decode(out[0, len(prompt):].tolist(), skip_special_tokens=True),
                })
        finally:
            model.train()
        self.sink.event.remote("eval_samples", f"replies to {len(samples)} validation prompts at step {step}",
                               {"step": step, "eval_loss": eval_loss, "samples": samples})
