"""The training loop that runs in every Ray Train worker.

Run by the trainer `training/driver.py` builds (in a job's Ray Job); `train_loop_per_worker` is what
`TorchTrainer` calls on each rank. The recipe has a fixed life: setup (data, model, optimizer,
resume) -> train (optimizer steps) -> finish (eval, final checkpoint with the adapter).

The loss of a step is the mean over every target token of the global batch, whatever the
number of workers: each rank sums its token losses and divides by the global token count, so
the gradient (after DDP's average, undone by the world-size factor) equals the single-process
gradient of the whole batch.
"""

from __future__ import annotations

import json
import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import ray.train
import ray.train.torch

from eft.training import checkpoint
from eft.training.checkpoint import BEST_FILE
from eft.training.config import TrainConfig
from eft.training.steps import host_peak_memory_gb, lr_lambda, peak_memory_gb, token_loss_sum
from eft.training.data import (
    DataError, TokenizeOptions, collate, example_tokens, global_batch_indices, shard_for_rank,
)
from eft.training.datacache import load_examples_cached
from eft.training.errors import PreemptionCheckpointed, TrainingUserError
from eft.training.model import load_reference_model, load_trainable_model, pretrained_path, skip_unused_quantization
from eft.training.packing import (balance_by_tokens, collate_packed, packed_inputs, packed_micro_batches,
                                  packed_targets, real_tokens)
from eft.training.preference import (
    PAIR_METRICS, micro_batch_loss, pair_logps, pair_sequences, sequence_bounds,
)
from eft.training.strategies import build_strategy

#: Seconds of training between two syncs: the workers agree on the checks (a preemption notice:
#: Ray Train's watcher itself polls the cluster every few seconds, and a spot notice gives 30 s
#: or more; pause, checkpoint and resize requests) and read the metrics rows logged since the
#: last sync off the device. Between syncs a step reads nothing back from the device and joins
#: no collective of its own, whatever `log_every_steps`.
SYNC_INTERVAL_S = 1.0
#: How long an interval checkpoint waits for the controller to take the previous report (it
#: polls every EFT_TRAIN_POLL_INTERVAL_S); past that it is queued behind it anyway.
REPORT_WAIT_S = 30.0
#: How long past the preemption deadline a worker waits to be stopped before giving up.
PREEMPTION_TEARDOWN_GRACE_S = 60.0
#: How long workers wait, after the checkpoint a resize asked for, for the resize to stop them.
RESIZE_WAIT_S = 90.0

log = logging.getLogger("eft.training.loop")


def _all_reduce_sum(values: list[Any], device: torch.device, op: str = "sum") -> list[float]:
    """All-reduce `values` (Python numbers and device scalars, in any mix) in one collective and
    read the result once: the host numbers travel in one copy to the device, the device
    scalars are never read on their own."""
    on_device = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    host = [i for i, v in enumerate(values) if not isinstance(v, torch.Tensor)]
    parts = [torch.tensor([float(values[i]) for i in host], dtype=torch.float64, device=device)]
    if on_device:
        parts.append(torch.stack([values[i].detach().reshape(()).to(device=device, dtype=torch.float64)
                                  for i in on_device]))
    tensor = torch.cat(parts) if len(parts) > 1 else parts[0]
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    reduced = tensor.tolist()
    out = [0.0] * len(values)
    for position, index in enumerate(host + on_device):
        out[index] = reduced[position]
    return out


def delivered_preemption_notice() -> Any:
    """The preemption notice Ray Train's watcher delivered to this worker, or None; read locally.

    `ray.train.get_preemption_info()` returns the same notice, but agrees on it across ranks
    through Ray Train's synchronization actor: a blocking round trip to another process at every
    call. On a busy node that round trip took a fifth of each step (a 1-worker job at 0.80 of a
    plain script's tokens/s, 0.99 without it). The watcher hands the notice to every worker
    (`mark_preempt`), so the loop reads it here and agrees with one collective in its own
    process group instead. Outside a Ray Train worker (local mode), Ray's own call answers.
    """
    try:
        from eft.training._ray import get_train_context

        return get_train_context().preemption_context.preemption_info
    except (ImportError, AttributeError, RuntimeError):
        return ray.train.get_preemption_info()


@dataclass
class Window:
    """Counters between two metric reports, summed over this rank's micro-batches."""

    loss_sum: Any = 0.0  # a device tensor once a step has run: read only at reports
    #: DPO: the pair metrics' sums (device tensors), by name (training/preference.py).
    sums: dict[str, Any] = field(default_factory=dict)
    #: What the loss is a mean over: target tokens, or (DPO) preference pairs.
    target_tokens: float = 0.0
    input_tokens: float = 0.0
    steps: int = 0
    started: float = field(default_factory=time.perf_counter)


@dataclass
class LoggedRow:
    """A metrics row closed at `step` and not read yet: its device values (the window's sums,
    the gradient norm) are read at the next sync, with every other row closed since."""

    step: int
    window: Window
    grad_norm: Any  # a device tensor, a number, or None (no clipping)
    learning_rate: float
    #: This rank's window, from the host's clock and memory counters (no device read).
    seconds: float
    peak_memory_gb: float
    host_peak_memory_gb: float


def sample_prompts(examples: list[Any], count: int) -> list[tuple[list[int], list[int]]]:
    """The prompts of the first `count` examples with a trained token, as (tokens before the
    first trained one, the trained run that follows: the reference reply)."""
    from eft.training.data import IGNORE_INDEX

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


class Recipe:
    def __init__(self, cfg: TrainConfig, sink: Any = None):
        self.cfg, self.sink = cfg, sink
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        if self.rank == 0 and sink is not None:
            sink.group_started.remote(self.world_size)  # its worker time counts from here
        self.device = ray.train.torch.get_device()
        # Evaluation: the best validation loss so far and its step, evaluations in a row
        # without a better one, and (publish "best", rank 0) that step's trainable weights.
        self.best_eval_loss, self.best_step, self.bad_evals = math.inf, 0, 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.stopped_early = False
        self.last_eval_step = -1
        self.dpo = cfg.objective == "dpo"
        self.reference: torch.nn.Module | None = None  # DPO of every weight: the frozen base
        self.eval_extra: dict[str, float] = {}  # DPO: the last evaluation's reward metrics
        # Pause: rank 0 asks the progress sink at each check without waiting (one call in
        # flight); once asked, the workers checkpoint and stop.
        self.pause_seen, self._control_ref = False, None
        # Rank 0: checkpoint requests read from the sink, and those served (a resize waits for one).
        self.checkpoints_asked = self.checkpoints_served = 0
        self.paused = False

    # --- setup ---------------------------------------------------------------------------

    def setup(self) -> None:
        from transformers import AutoTokenizer

        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(pretrained_path(cfg))
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        options = TokenizeOptions(cfg.max_seq_len, cfg.train_on, cfg.system_message,
                                  tuple(sorted(cfg.data_columns.items())), cfg.objective)
        try:
            self.train_examples = load_examples_cached(cfg.training_file, self.tokenizer, options,
                                                       cfg.data_cache_dir).examples
            self.valid_examples = (
                load_examples_cached(cfg.validation_file, self.tokenizer, options, cfg.data_cache_dir).examples
                if cfg.validation_file else []
            )
        except DataError as exc:
            param = "validation_file" if exc.path == cfg.validation_file else "training_file"
            raise TrainingUserError(f"user_error.{exc.code}", str(exc), param) from None
        self.strategy = build_strategy(cfg)
        self.strategy.prepare(load_trainable_model(cfg))
        if self.dpo and cfg.method == "full":
            self.reference = load_reference_model(cfg, self.device)
        if cfg.compile:
            # In place, so the strategy's wrapper (DDP, FSDP, DeepSpeed) calls the compiled
            # forward; dynamic shapes because packed and padded lengths vary by step.
            self.strategy.module.compile(dynamic=True)
        self.lr_factor = lr_lambda(cfg)
        self.step = 0
        self.eval_prompts = sample_prompts([p.chosen for p in self.valid_examples] if self.dpo else self.valid_examples,
                                           cfg.eval_sample_prompts)
        # Builds the next step's batches while this one trains (collation is host work).
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eft-batches")
        self._prefetch: tuple[int, Future] | None = None
        resume_from = ray.train.get_checkpoint()
        if resume_from is not None:
            started = time.perf_counter()
            with resume_from.as_directory() as directory:
                state = checkpoint.restore(Path(directory), self.strategy)
                self._restore_eval_state(state, Path(directory))
            self.step = int(state["step"])
            if self.rank == 0 and self.sink is not None:
                ray.get(self.sink.resumed.remote(self.step, self.world_size, state.get("reason", "interval"),
                                                 time.perf_counter() - started))
        elif cfg.init_from:
            self._continue_from(cfg)
        if self.rank == 0 and self.sink is not None:
            # Asked before the workers started? The answer is read at the first check after it
            # comes (nothing waits for it here). The sink counts requests from this group's
            # start (`group_started`): those made before were for the group before it.
            self._control_ref = self.sink.control.remote()

    def _continue_from(self, cfg: TrainConfig) -> None:
        """A job's first start from another job's checkpoint: its trainable weights and, with
        `init_optimizer`, its optimizer state and step (the run goes on where that one was)."""
        from eft.training import storage

        place = storage.resolve(cfg.init_from)
        source = ray.train.Checkpoint(path=place.path, filesystem=place.filesystem)
        with source.as_directory() as directory:
            if cfg.init_optimizer:
                self.step = int(checkpoint.restore(Path(directory), self.strategy)["step"])
            else:
                self.strategy.load_trainable_state(checkpoint.load_trainable(Path(directory)))
        if self.rank == 0 and self.sink is not None:
            what = "its optimizer state, going on from" if cfg.init_optimizer else "its weights only, from"
            ray.get(self.sink.event.remote(
                "continued", f"continued from job {cfg.init_job} step {cfg.init_step} with {what} step {self.step}",
                {"job_id": cfg.init_job, "step": cfg.init_step, "optimizer_state": cfg.init_optimizer,
                 "from_step": self.step}))

    # --- train ---------------------------------------------------------------------------

    def _micro_batches(self, step: int) -> tuple[list[Any], float]:
        """This rank's micro-batches for `step`, and the global batch's target-token count.

        Every rank gets the same number of micro-batches (sharded strategies run collectives
        in each forward and backward); a rank with too few examples gets empty ones, which
        `train_step` runs as zero-weight passes. Packed, a micro-batch is `micro_batch_size`
        rows of up to `max_seq_len` tokens each; every rank packs every rank's share (a pure
        function of the step), so all agree on the count without a collective.
        """
        cfg = self.cfg
        n = len(self.train_examples)
        indices = global_batch_indices(n, cfg.seed, step, cfg.global_batch_size)
        # The loss is a mean over target tokens, or (DPO) over pairs.
        global_tokens = len(indices) if self.dpo else sum(self.train_examples[i].loss_tokens for i in indices)
        if cfg.packing:
            # The ranks' shares are balanced by tokens (a rank's step time follows its tokens),
            # then packed into micro-batches of at most micro_batch_size x max_seq_len tokens
            # (a DPO pair, two sequences, is packed whole: twice the budget).
            lengths = [example_tokens(self.train_examples[i]) for i in indices]
            budget = cfg.micro_batch_size * cfg.max_seq_len * (2 if self.dpo else 1)
            shares = [packed_micro_batches([self.train_examples[indices[p]] for p in share], budget)
                      for share in balance_by_tokens(lengths, self.world_size)]
            count = max(len(share) for share in shares)
            return shares[self.rank] + [[]] * (count - len(shares[self.rank])), float(global_tokens)
        mine = [self.train_examples[i] for i in shard_for_rank(indices, self.rank, self.world_size)]
        largest_share = -(-cfg.global_batch_size // self.world_size)
        count = -(-largest_share // cfg.micro_batch_size)
        return [list(part) for part in np.array_split(np.asarray(mine, dtype=object), count)], float(global_tokens)

    def _host_batches(self, step: int) -> tuple[list[tuple[dict[str, torch.Tensor], int, float]], float]:
        """Step `step`'s micro-batches as host tensors with their non-padding token counts (known
        on the host: no device sync) and loss weights, and the global target-token count."""
        micro_batches, global_tokens = self._micro_batches(step)
        pin = self.device.type == "cuda"  # pinned memory lets the copy overlap with compute
        out = []
        for micro_batch in micro_batches:
            # An empty share still joins the collectives, with a zero-weight pass.
            examples = micro_batch or [self.train_examples[0]]
            if self.dpo:  # every chosen conversation, then every rejected one
                examples = pair_sequences(examples)
            if self.cfg.packing:
                batch, tokens = collate_packed(examples, self.pad_id), real_tokens(examples)
            else:
                batch, tokens = collate(examples, self.pad_id), sum(len(e.input_ids) for e in examples)
            if pin:
                batch = {k: v if k == "max_length" else v.pin_memory() for k, v in batch.items()}
            out.append((batch, tokens, 1.0 if micro_batch else 0.0))
        return out, global_tokens

    def _next_host_batches(self) -> tuple[list[tuple[dict[str, torch.Tensor], int, float]], float]:
        """This step's host batches (built in the background during the previous step), and
        start building the next step's."""
        if self._prefetch is not None and self._prefetch[0] == self.step:
            ready = self._prefetch[1].result()
        else:
            ready = self._host_batches(self.step)
        self._prefetch = None
        if self.step + 1 < self.cfg.total_steps:
            self._prefetch = (self.step + 1, self._loader.submit(self._host_batches, self.step + 1))
        return ready

    def _to_device(self, host_batch: dict[str, torch.Tensor], pin: bool) -> dict[str, Any]:
        if "cu_seq_lens" in host_batch:
            return {**packed_inputs(host_batch, self.device, self.cfg.attention),
                    **packed_targets(host_batch, self.device)}
        return {k: v.to(self.device, non_blocking=pin) for k, v in host_batch.items()}

    def train_step(self, window: Window) -> Any:
        """One optimizer step over the global batch. Returns the gradient norm if clipped
        (a device tensor: reading it would wait for the step, so only reports do)."""
        # The random state (dropout) is a function of (seed, step, rank), so a resumed run
        # draws what the uninterrupted one would have.
        torch.manual_seed((self.cfg.seed * 1_000_003 + self.step) * 1_009 + self.rank)
        micro_batches, global_tokens = self._next_host_batches()
        # Gradient reduction averages over ranks; scale back so the result is the global mean.
        scale = self.world_size / global_tokens
        strategy = self.strategy
        pin = self.device.type == "cuda"
        for i, (host_batch, tokens, weight) in enumerate(micro_batches):
            batch = self._to_device(host_batch, pin)
            sequences = sequence_bounds(host_batch) if self.dpo else None
            reference = self._reference_logps(batch, sequences) if self.dpo else None
            with strategy.accumulate(last=i == len(micro_batches) - 1):
                with strategy.autocast():
                    if self.dpo:
                        loss_sum, sums = micro_batch_loss(pair_logps(strategy.model, batch, sequences), reference,
                                                          self.cfg.dpo_beta, weight)
                    else:
                        loss_sum = token_loss_sum(strategy.model, batch) * weight
                strategy.backward(loss_sum * scale)
            window.loss_sum += loss_sum.detach()
            if self.dpo:
                for name, value in sums.items():
                    window.sums[name] = window.sums.get(name, 0.0) + value
            window.input_tokens += tokens * weight
        window.target_tokens += global_tokens / self.world_size
        grad_norm = strategy.step(self.cfg.learning_rate * self.lr_factor(self.step))
        self.step += 1
        window.steps += 1
        return grad_norm

    @torch.no_grad()
    def _reference_logps(self, batch: dict[str, Any], sequences: Any) -> torch.Tensor:
        """DPO: the micro-batch's sequence log-probabilities under the reference model: the
        frozen copy (full fine-tuning), or the trained model with its adapter switched off."""
        import contextlib

        if self.reference is not None:
            model, switched_off = self.reference, contextlib.nullcontext()
        else:
            model, switched_off = self.strategy.model, self.strategy.module.disable_adapter()
        with switched_off, self.strategy.autocast():
            return pair_logps(model, batch, sequences)

    def _close_row(self, window: Window, grad_norm: Any) -> LoggedRow:
        """End the metrics window at this step: what the host knows is taken now, the device's
        values stay on the device until the next sync."""
        return LoggedRow(step=self.step, window=window, grad_norm=grad_norm,
                         learning_rate=self.cfg.learning_rate * self.lr_factor(self.step - 1),
                         seconds=time.perf_counter() - window.started,
                         peak_memory_gb=peak_memory_gb(self.device), host_peak_memory_gb=host_peak_memory_gb())

    def _sync(self, rows: list[LoggedRow], checks: list[float]) -> tuple[list[dict[str, float]], list[float], float]:
        """Read every row closed since the last sync and agree on this rank's `checks` (flags
        and deadlines, maxed over ranks), in two collectives whatever the number of rows.
        Returns the rows' metrics (reduced over ranks, in step order), the checks, and the
        slowest rank's seconds since the previous sync."""
        names = [[n for n in PAIR_METRICS if n in row.window.sums] if self.dpo else [] for row in rows]
        # Sums over ranks: each row's loss sum (and DPO pair sums) and input tokens. Reading the
        # result waits for the device: every row's step has run by then.
        sums = _all_reduce_sum([v for row, pair in zip(rows, names) for v in (
            row.window.loss_sum, row.window.input_tokens, *(row.window.sums[n] for n in pair))],
            self.device) if rows else []
        now = time.perf_counter()
        if rows and rows[-1].step == self.step:
            # The newest row ends now that the device has caught up (on a GPU the host runs ahead).
            rows[-1].seconds = now - rows[-1].window.started
        since, self._synced_at = now - self._synced_at, now
        # Maxima over ranks: the checks, the slowest rank's times, the memory peaks, and the
        # gradient norm (the same on every rank).
        norms = [row.grad_norm for row in rows if row.grad_norm is not None]
        maxima = _all_reduce_sum([*checks, since, *(v for row in rows for v in (
            row.seconds, row.peak_memory_gb, row.host_peak_memory_gb)), *norms], self.device, op="max")
        checks, since, maxima = maxima[:len(checks)], maxima[len(checks)], maxima[len(checks) + 1:]
        summed, timed, norms_read = iter(sums), iter(maxima), iter(maxima[3 * len(rows):])
        out = []
        for row, pair in zip(rows, names):
            loss_sum, input_tokens = next(summed), next(summed)
            pair_sums = [next(summed) for _ in pair]
            seconds, peak, host_peak = next(timed), next(timed), next(timed)
            target_tokens = row.window.target_tokens * self.world_size
            loss = loss_sum / max(1.0, target_tokens)
            if not math.isfinite(loss):
                raise TrainingUserError(
                    "user_error.nan_loss",
                    f"the loss became {loss} at step {row.step}: lower learning_rate or check the data",
                    "hyperparameters.learning_rate",
                )
            metrics = {
                "step": row.step,
                "loss": loss,
                "peak_memory_gb": peak,
                "host_peak_memory_gb": host_peak,
                "learning_rate": row.learning_rate,
                "tokens_per_s": input_tokens / max(seconds, 1e-9),
                "step_time_s": seconds / max(1, row.window.steps),
                "epoch": row.step * self.cfg.global_batch_size / len(self.train_examples),
                "world_size": self.world_size,
            }
            if row.grad_norm is not None:
                metrics["grad_norm"] = next(norms_read)
            for name, value in zip(pair, pair_sums):  # DPO: means over the window's pairs
                metrics[name] = value / max(1.0, target_tokens)
            out.append(metrics)
        return out, checks, since

    def _report(self, metrics: dict[str, float], with_checkpoint: bool, reason: str = "interval",
                final: bool = False) -> None:
        """Every rank reports at the same cadence (a barrier). With a checkpoint, every rank
        takes part in gathering the state and rank 0 writes it (and the adapter, on the final
        one).

        Interval and time checkpoints are handed to Ray Train asynchronously: its background
        thread persists the written directory and queues the report while training goes on.
        Synchronously, each report would wait for the controller to take it off the worker's
        one-slot queue, which it does once per poll. Preemption and final checkpoints stay
        synchronous: they must be persisted before the worker stops."""
        if not with_checkpoint:
            ray.train.report(metrics)
            return
        if reason in ("interval", "time"):
            self._wait_for_previous_report()
            directory = Path(tempfile.mkdtemp(prefix="eft-ckpt-"))
            trainable = checkpoint.save(directory, self.strategy, self.rank, self.step,
                                        self.world_size, reason, metrics)
            del trainable
            self._save_adapter_config(directory)
            self._save_eval_state(directory)
            if self.rank == 0:
                # Ray Train deletes the directory once it is persisted.
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(directory)),
                                 checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC)
            else:
                shutil.rmtree(directory, ignore_errors=True)
                ray.train.report(metrics, checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC)
            self.last_checkpoint_at = time.monotonic()
            return
        with tempfile.TemporaryDirectory(prefix="eft-ckpt-") as tmp:
            directory = Path(tmp)
            trainable = checkpoint.save(directory, self.strategy, self.rank, self.step,
                                        self.world_size, reason, metrics)
            if final and self.rank == 0:
                published = trainable
                if self.cfg.publish == "best" and self.best_state is not None and self.best_step != self.step:
                    published = self.best_state
                self.strategy.module.save_pretrained(directory / "adapter", state_dict=published)
                self.tokenizer.save_pretrained(directory / "adapter")
            else:
                self._save_adapter_config(directory)
            self._save_eval_state(directory)
            saved = ray.train.Checkpoint.from_directory(tmp) if self.rank == 0 else None
            ray.train.report(metrics, checkpoint=saved)
        self.last_checkpoint_at = time.monotonic()

    def _save_eval_state(self, directory: Path) -> None:
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

    def _save_adapter_config(self, directory: Path) -> None:
        """Rank 0 puts the adapter's config beside a LoRA checkpoint's weights (a few hundred
        bytes): a model server loads the checkpoint from the two (service/inference.py)."""
        config = getattr(self.strategy.module, "peft_config", {}).get("default")
        if self.rank == 0 and config is not None:
            config.save_pretrained(str(directory / "adapter"))

    def _wait_for_previous_report(self) -> None:
        """Wait until the Train controller has taken this worker's previous report. At most one
        checkpoint is in flight: each is saved at its exact step, and the one a restart resumes
        from is never more than one interval behind. Checkpoints as far apart as the
        controller's poll (`EFT_TRAIN_POLL_INTERVAL_S`) never wait here; closer ones wait out
        the difference instead of piling up."""
        from eft.training._ray import reports_in_flight

        give_up_at = time.monotonic() + REPORT_WAIT_S
        while reports_in_flight() and time.monotonic() < give_up_at:
            time.sleep(0.005)

    def _publish(self, metrics: dict[str, float], wait: bool = False) -> None:
        """Rank 0 sends a step's metrics to the progress sink without waiting, unless `wait`."""
        if self.rank != 0 or self.sink is None:
            return
        ref = self.sink.record.remote(int(metrics["step"]), metrics)
        if wait:
            ray.get(ref)

    def _control(self) -> tuple[bool, bool]:
        """Rank 0: (asked to pause, asked for a checkpoint now), as far as the sink has answered
        (the question is asked again once answered; nothing here waits)."""
        if self.rank != 0 or self.sink is None:
            return False, False
        if self._control_ref is not None:
            ready, _ = ray.wait([self._control_ref], timeout=0)
            if ready:
                pause, asked = ray.get(self._control_ref)
                self.pause_seen = self.pause_seen or bool(pause)
                self.checkpoints_asked = max(self.checkpoints_asked, int(asked))
                self._control_ref = None
        if self._control_ref is None and not self.pause_seen:
            self._control_ref = self.sink.control.remote()
        return self.pause_seen, self.checkpoints_asked > self.checkpoints_served

    def _local_checks(self) -> list[float]:
        """This rank's view at a sync: [a preemption notice, its deadline in ms (0 if none),
        the time-based checkpoint interval passed, the job asked to pause, the controller asked
        for a checkpoint before it resizes the worker group]; `_sync` maxes them over ranks."""
        notice = delivered_preemption_notice()
        overdue = bool(self.cfg.checkpoint_every_seconds) and (
            time.monotonic() - self.last_checkpoint_at >= self.cfg.checkpoint_every_seconds)
        pause, resize = self._control()
        return [float(notice is not None), float(notice.deadline_ms or 0) if notice else 0.0, float(overdue),
                float(pause), float(resize)]

    def _leave_for_preemption(self) -> None:
        """An elastic job need not wait for the drained node to go: once every rank has handed
        its preemption report to Ray Train (the collective below: a rank reaches it only after
        its report is queued, and the controller reads a worker's queued report before its
        error), the group ends and Ray Train restarts it from that checkpoint on the nodes that
        stay (`LosslessResize` leaves draining nodes out). A fixed-size job keeps waiting: its
        workers would only wait for room elsewhere."""
        _all_reduce_sum([1.0], self.device)
        raise PreemptionCheckpointed(
            f"checkpointed at step {self.step} on a preemption notice; the job goes on without the "
            "draining node(s)")

    def _wait_out_preemption(self, deadline_ms: float) -> None:
        """After the preemption checkpoint, train no further (every later step would be lost)
        and wait for Ray Train to stop this worker group and resume it on what is left."""
        deadline_s = (deadline_ms / 1000.0) if deadline_ms else time.time() + 120.0
        give_up_at = max(deadline_s, time.time()) + PREEMPTION_TEARDOWN_GRACE_S
        while time.time() < give_up_at:
            time.sleep(0.2)
        raise RuntimeError(
            f"the worker group was not stopped {PREEMPTION_TEARDOWN_GRACE_S:.0f}s after the "
            "preemption deadline; restarting from the preemption checkpoint"
        )

    def _wait_for_resize(self) -> None:
        """After the resize checkpoint: wait for Ray Train to stop this worker group (it starts
        the resized one from that checkpoint). Should no resize come within RESIZE_WAIT_S (the
        controller changed its mind), training goes on from here. Every rank waits the same."""
        give_up_at = time.monotonic() + RESIZE_WAIT_S
        while time.monotonic() < give_up_at:
            time.sleep(0.2)
        log.warning("no resize came %.0f s after the resize checkpoint at step %s; training on",
                    RESIZE_WAIT_S, self.step)

    def train(self) -> None:
        cfg = self.cfg
        window, rows = Window(), []
        self.strategy.model.train()
        self.last_checkpoint_at = time.monotonic()
        self._synced_at = time.perf_counter()
        sync_every, next_sync, steps_at_sync = 1, self.step + 1, self.step
        while self.step < cfg.total_steps and not self.stopped_early:
            grad_norm = self.train_step(window)
            if self.rank == 0 and self.sink is not None:
                self.sink.reached.remote(self.step)  # known on the host: nothing waits
            final = self.step == cfg.total_steps
            # Step 1 always has a row: the first loss shows at once, and the first (warm-up)
            # step's time stays apart from the steady state's.
            at_log = self.step % cfg.log_every_steps == 0 or self.step == 1 or final
            at_ckpt = self.step % cfg.checkpoint_every_steps == 0 and not final
            at_eval = bool(cfg.eval_every_steps) and self.step % cfg.eval_every_steps == 0 and not final
            if at_log or at_ckpt or at_eval:
                rows.append(self._close_row(window, grad_norm))
                window = Window()
            # Decided by step counts alone, so every rank joins the same collectives; between
            # syncs nothing waits for the device.
            checking = self.step >= next_sync and not final
            if not (checking or at_ckpt or at_eval or final):
                continue
            published, checks, since = self._sync(rows, self._local_checks() if checking else [0.0] * 5)
            rows = []
            noticed, deadline_ms, overdue, pausing, resizing = (c > 0 for c in checks)
            preempt_deadline_ms = checks[1] if noticed else None
            if (noticed or overdue or pausing or resizing) and window.steps:
                # A check asks for a checkpoint at a step with no row yet: its row comes now.
                published += self._sync([self._close_row(window, grad_norm)], [])[0]
                window = Window()
            # About SYNC_INTERVAL_S of training between syncs, from the slowest rank's time (the
            # same on every rank).
            sync_every = max(1, int(SYNC_INTERVAL_S / max(since / max(1, self.step - steps_at_sync), 1e-3)))
            next_sync, steps_at_sync = self.step + sync_every, self.step
            metrics = published[-1] if published else {}
            if at_eval:
                self._evaluate_during(metrics)
            for row in published:
                self._publish(row)
            if final:
                return
            if noticed:
                self._report(metrics, with_checkpoint=True, reason="preemption")
                if cfg.min_workers < cfg.max_workers:
                    self._leave_for_preemption()
                self._wait_out_preemption(preempt_deadline_ms)
            if pausing:
                # Checkpointed as on a preemption notice, then the workers end: the driver
                # marks the job paused, and a resume continues from this checkpoint.
                self._report({**metrics, "paused": 1.0}, with_checkpoint=True, reason="pause")
                self.paused = True
                return
            if self.stopped_early:
                return  # the final checkpoint comes next, at this step
            if resizing:
                # The controller resizes the worker group once this checkpoint is registered:
                # the new group resumes here, and no step is trained twice. Until it stops this
                # group, training on would only make steps to lose.
                self._report(metrics, with_checkpoint=True, reason="resize")
                self.checkpoints_served = self.checkpoints_asked
                self._wait_for_resize()
            elif at_ckpt or overdue:
                self._report(metrics, with_checkpoint=True, reason="interval" if at_ckpt else "time")

    # --- finish --------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean target-token loss over the validation set, sharded over ranks."""
        if not self.valid_examples:
            return None
        if self.dpo:
            return self._evaluate_pairs()
        model = self.strategy.model
        model.eval()
        size = self.cfg.micro_batch_size
        chunk = size * self.world_size
        loss_sum, tokens = 0.0, 0.0
        # Equal pass counts on every rank (sharded strategies need them); empty shares
        # run a zero-weight pass.
        for start in range(0, len(self.valid_examples), chunk):
            part = self.valid_examples[start : start + chunk]
            examples = [part[i] for i in shard_for_rank(list(range(len(part))), self.rank, self.world_size)]
            batch = {k: v.to(self.device) for k, v in
                     collate(examples or part[:1], self.pad_id).items()}
            with self.strategy.autocast():
                value = float(token_loss_sum(model, batch))
            if examples:
                loss_sum += value
                tokens += sum(e.loss_tokens for e in examples)
        loss_sum, tokens = _all_reduce_sum([loss_sum, tokens], self.device)
        model.train()
        return loss_sum / max(1.0, tokens)

    @torch.no_grad()
    def _evaluate_pairs(self) -> float:
        """DPO: the mean DPO loss over the validation pairs, sharded over ranks as `evaluate`
        shards examples; the mean rewards, margin and accuracy go to `eval_extra`."""
        model = self.strategy.model
        model.eval()
        chunk = self.cfg.micro_batch_size * self.world_size
        totals = dict.fromkeys(("loss", *PAIR_METRICS), 0.0)
        pairs = 0
        for start in range(0, len(self.valid_examples), chunk):
            part = self.valid_examples[start : start + chunk]
            mine = [part[i] for i in shard_for_rank(list(range(len(part))), self.rank, self.world_size)]
            host = collate(pair_sequences(mine or part[:1]), self.pad_id)
            batch, sequences = {k: v.to(self.device) for k, v in host.items()}, sequence_bounds(host)
            reference = self._reference_logps(batch, sequences)
            with self.strategy.autocast():
                policy = pair_logps(model, batch, sequences)
            loss_sum, sums = micro_batch_loss(policy, reference, self.cfg.dpo_beta, 1.0 if mine else 0.0)
            for name, value in {"loss": loss_sum, **sums}.items():
                totals[name] += float(value)
            pairs += len(mine)
        names = list(totals)
        *reduced, pairs = _all_reduce_sum([totals[n] for n in names] + [float(pairs)], self.device)
        model.train()
        means = {name: value / max(1.0, pairs) for name, value in zip(names, reduced)}
        self.eval_extra = {f"eval_{name}": means[name] for name in PAIR_METRICS}
        return means["loss"]

    def _evaluate_during(self, metrics: dict[str, float]) -> None:
        """An evaluation in the course of training (every rank, at the same steps): the
        validation loss into `metrics`, the best one tracked, replies to the sample prompts
        sent to the job, and early stopping decided (alike on every rank: the loss is reduced)."""
        eval_loss = self.evaluate()
        if eval_loss is None:
            return
        metrics["eval_loss"] = eval_loss
        metrics.update(self.eval_extra)
        self._track_best(eval_loss)
        metrics["best_eval_loss"], metrics["best_step"] = self.best_eval_loss, float(self.best_step)
        self._send_samples(eval_loss)
        patience = self.cfg.early_stopping_patience
        if patience and self.bad_evals >= patience:
            self.stopped_early = True
            if self.rank == 0 and self.sink is not None:
                self.sink.event.remote(
                    "early_stopped",
                    f"stopped at step {self.step} of {self.cfg.total_steps}: {self.bad_evals} evaluations without a "
                    f"validation loss below {self.best_eval_loss:.4f} (step {self.best_step})",
                    {"step": self.step, "best_step": self.best_step, "best_eval_loss": self.best_eval_loss,
                     "patience": patience})

    def _track_best(self, eval_loss: float) -> None:
        self.last_eval_step = self.step
        if eval_loss < self.best_eval_loss - self.cfg.early_stopping_min_delta:
            self.best_eval_loss, self.best_step, self.bad_evals = eval_loss, self.step, 0
            if self.cfg.publish == "best":
                state = self.strategy.trainable_state()  # a collective under sharded strategies
                self.best_state = {k: v.clone() for k, v in state.items()} if self.rank == 0 else None
        else:
            self.bad_evals += 1

    def _restore_eval_state(self, state: dict[str, Any], directory: Path) -> None:
        """What a checkpoint kept of the evaluations (see `_report`)."""
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
    def _send_samples(self, eval_loss: float) -> None:
        """Rank 0 replies greedily to the sample prompts and sends them to the job as an
        `eval_samples` event. Only where rank 0 holds whole weights (DDP, ZeRO-1/2): under
        FSDP and ZeRO-3 a forward pass is a collective, and generation lengths differ."""
        if not self.eval_prompts or self.rank != 0 or self.sink is None or self.cfg.strategy in ("fsdp", "zero3"):
            return
        from eft.training.chat import stop_token_ids

        model = self.strategy.module
        model.eval()
        stops = stop_token_ids(self.tokenizer, getattr(model, "generation_config", None))
        samples = []
        try:
            for prompt, reference in self.eval_prompts:
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
        self.sink.event.remote("eval_samples", f"replies to {len(samples)} validation prompts at step {self.step}",
                               {"step": self.step, "eval_loss": eval_loss, "samples": samples})

    def finish(self) -> None:
        metrics: dict[str, float] = {
            "step": self.step, "final": 1.0, "world_size": self.world_size,
            # How many linear layers hold 4-bit base weights (QLoRA); 0 otherwise.
            "quantized_linear_layers": sum(
                type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes")
                for m in self.strategy.module.modules()
            ),
        }
        eval_loss = self.evaluate()
        if eval_loss is not None:
            metrics["eval_loss"] = eval_loss
            metrics.update(self.eval_extra)
            if self.last_eval_step != self.step:  # an early stop evaluated this step already
                self._track_best(eval_loss)
                self._send_samples(eval_loss)
            metrics["best_eval_loss"], metrics["best_step"] = self.best_eval_loss, float(self.best_step)
        # Alike on every rank: the best step comes from the reduced losses.
        best = self.cfg.publish == "best" and math.isfinite(self.best_eval_loss)
        metrics["published_step"] = float(self.best_step if best else self.step)
        metrics["stopped_early"] = float(self.stopped_early)
        peaks = [0.0] * self.world_size
        peaks[self.rank] = peak_memory_gb(self.device)
        for rank, value in enumerate(_all_reduce_sum(peaks, self.device)):
            metrics[f"peak_memory_gb_rank{rank}"] = value
        metrics["peak_memory_gb"] = max(metrics[f"peak_memory_gb_rank{r}"] for r in range(self.world_size))
        if self.cfg.predicted_memory_gb is not None:
            metrics["predicted_memory_gb"] = self.cfg.predicted_memory_gb
        # Waiting on the last call means every earlier metric has landed too.
        self._publish(metrics, wait=True)
        self._report(metrics, with_checkpoint=True, reason="final", final=True)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Entry point of every Ray Train worker: `config` holds the TrainConfig as a dict under
    "train" and, optionally, a ProgressSink actor handle under "progress"."""
    cfg = TrainConfig.from_dict(config["train"])
    skip_unused_quantization(cfg)
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
    recipe = Recipe(cfg, config.get("progress"))
    try:
        recipe.setup()
        recipe.train()
        if not recipe.paused:
            recipe.finish()
    except torch.OutOfMemoryError as exc:
        raise TrainingUserError(
            "user_error.out_of_memory",
            f"a worker ran out of accelerator memory ({str(exc).splitlines()[0][:300]}); lower "
            "micro_batch_size or max_seq_len, enable gradient_checkpointing or offload, or use "
            "a sharded strategy (POST /plan shows what fits)",
            "hyperparameters.micro_batch_size",
        ) from None
