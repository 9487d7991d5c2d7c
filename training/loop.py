"""The training loop that runs in every Ray Train worker.

Run by the trainer `training/driver.py` builds (in a job's Ray Job); `train_loop_per_worker` is what
`TorchTrainer` calls on each rank. The recipe has a fixed life, the same for every objective:
setup (data, model, optimizer, resume) -> train (optimizer steps, syncs, checkpoints) -> finish
(eval, final checkpoint with the adapter). Its parts each have a room:

- what the loss is (supervised tokens, DPO pairs): the job's objective, `training/objectives/`;
- which records a rank trains on and how they are collated: `training/batches.py`;
- evaluation, the best step and early stopping: `training/evaluation.py`;
- preemption notices, pause and resize requests: `training/interruptions.py`.

The loss of a step is the mean over every unit of the global batch (target tokens, or pairs),
whatever the number of workers: each rank sums its losses and divides by the global count, so
the gradient (after DDP's average, undone by the world-size factor) equals the single-process
gradient of the whole batch.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import ray.train
import ray.train.torch

from eft.training import checkpoint
from eft.training.config import TrainConfig
from eft.training.steps import host_peak_memory_gb, lr_lambda, peak_memory_gb
from eft.training.data import (
    DataError, TokenizeOptions,
)
from eft.training.datacache import load_examples_cached
from eft.training.errors import TrainingUserError
from eft.training.model import load_trainable_model, pretrained_path, skip_unused_quantization
from eft.training.collectives import all_reduce_sum as _all_reduce_sum
from eft.training.batches import Batches
from eft.training.evaluation import Evaluation
from eft.training.interruptions import Interruptions
from eft.training.objectives import for_config
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

log = logging.getLogger("eft.training.loop")


@dataclass
class Window:
    """Counters between two metric reports, summed over this rank's micro-batches."""

    loss_sum: Any = 0.0  # a device tensor once a step has run: read only at reports
    #: The objective's metric sums (device tensors), by name (training/objectives/).
    sums: dict[str, Any] = field(default_factory=dict)
    #: What the loss is a mean over: the objective's units (target tokens, preference pairs).
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


class Recipe:
    def __init__(self, cfg: TrainConfig, sink: Any = None):
        self.cfg, self.sink = cfg, sink
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        if self.rank == 0 and sink is not None:
            sink.group_started.remote(self.world_size)  # its worker time counts from here
        self.device = ray.train.torch.get_device()
        self.objective = for_config(cfg)
        self.evaluation = Evaluation(cfg, self.objective, self.rank, self.world_size, self.device, sink)
        self.interruptions = Interruptions(cfg, self.rank, self.device, sink)
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
        self.objective.prepare(self.strategy, self.device)
        if cfg.compile:
            # In place, so the strategy's wrapper (DDP, FSDP, DeepSpeed) calls the compiled
            # forward; dynamic shapes because packed and padded lengths vary by step.
            self.strategy.module.compile(dynamic=True)
        self.lr_factor = lr_lambda(cfg)
        self.step = 0
        self.evaluation.attach(self.strategy, self.tokenizer, self.pad_id, self.valid_examples)
        self.batches = Batches(cfg, self.objective, self.train_examples, self.pad_id, self.rank, self.world_size,
                               self.device)
        resume_from = ray.train.get_checkpoint()
        if resume_from is not None:
            started = time.perf_counter()
            with resume_from.as_directory() as directory:
                state = checkpoint.restore(Path(directory), self.strategy)
                self.evaluation.restore(state, Path(directory))
            self.step = int(state["step"])
            if self.rank == 0 and self.sink is not None:
                ray.get(self.sink.resumed.remote(self.step, self.world_size, state.get("reason", "interval"),
                                                 time.perf_counter() - started))
        elif cfg.init_from:
            self._continue_from(cfg)
        self.interruptions.ask()

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

    def train_step(self, window: Window) -> Any:
        """One optimizer step over the global batch. Returns the gradient norm if clipped
        (a device tensor: reading it would wait for the step, so only reports do)."""
        # The random state (dropout) is a function of (seed, step, rank), so a resumed run
        # draws what the uninterrupted one would have.
        torch.manual_seed((self.cfg.seed * 1_000_003 + self.step) * 1_009 + self.rank)
        micro_batches, global_tokens = self.batches.for_step(self.step)
        # Gradient reduction averages over ranks; scale back so the result is the global mean.
        scale = self.world_size / global_tokens
        strategy = self.strategy
        pin = self.device.type == "cuda"
        for i, (host_batch, tokens, weight) in enumerate(micro_batches):
            batch = self.batches.to_device(host_batch, pin)
            prepared = self.objective.before(strategy, batch, host_batch)
            with strategy.accumulate(last=i == len(micro_batches) - 1):
                with strategy.autocast():
                    loss_sum, sums = self.objective.loss(strategy.model, batch, prepared, weight)
                strategy.backward(loss_sum * scale)
            window.loss_sum += loss_sum.detach()
            for name, value in sums.items():
                window.sums[name] = window.sums.get(name, 0.0) + value
            window.input_tokens += tokens * weight
        window.target_tokens += global_tokens / self.world_size
        grad_norm = strategy.step(self.cfg.learning_rate * self.lr_factor(self.step))
        self.step += 1
        window.steps += 1
        return grad_norm

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
        names = [[n for n in self.objective.metrics if n in row.window.sums] for row in rows]
        # Sums over ranks: each row's loss sum (and the objective's metric sums) and input
        # tokens. Reading the result waits for the device: every row's step has run by then.
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
            for name, value in zip(pair, pair_sums):  # means over the window's units
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
            self.evaluation.save(directory)
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
                published = self.evaluation.published_state(self.step, trainable)
                self.strategy.module.save_pretrained(directory / "adapter", state_dict=published)
                self.tokenizer.save_pretrained(directory / "adapter")
            else:
                self._save_adapter_config(directory)
            self.evaluation.save(directory)
            saved = ray.train.Checkpoint.from_directory(tmp) if self.rank == 0 else None
            ray.train.report(metrics, checkpoint=saved)
        self.last_checkpoint_at = time.monotonic()

    def _save_adapter_config(self, directory: Path) -> None:
        """Rank 0 puts the adapter's config beside a LoRA checkpoint's weights (a few hundred
        bytes): a model server loads the checkpoint from the two (service/serving/engine.py)."""
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

    def train(self) -> None:
        cfg = self.cfg
        window, rows = Window(), []
        self.strategy.model.train()
        self.last_checkpoint_at = time.monotonic()
        self._synced_at = time.perf_counter()
        sync_every, next_sync, steps_at_sync = 1, self.step + 1, self.step
        while self.step < cfg.total_steps and not self.evaluation.stopped_early:
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
            published, checks, since = self._sync(rows, self.interruptions.checks(self.last_checkpoint_at) if checking else [0.0] * 5)
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
                self.evaluation.during(self.step, metrics)
            for row in published:
                self._publish(row)
            if final:
                return
            if noticed:
                self._report(metrics, with_checkpoint=True, reason="preemption")
                if cfg.min_workers < cfg.max_workers:
                    self.interruptions.leave_for_preemption(self.step)
                self.interruptions.wait_out_preemption(preempt_deadline_ms)
            if pausing:
                # Checkpointed as on a preemption notice, then the workers end: the driver
                # marks the job paused, and a resume continues from this checkpoint.
                self._report({**metrics, "paused": 1.0}, with_checkpoint=True, reason="pause")
                self.paused = True
                return
            if self.evaluation.stopped_early:
                return  # the final checkpoint comes next, at this step
            if resizing:
                # The controller resizes the worker group once this checkpoint is registered:
                # the new group resumes here, and no step is trained twice. Until it stops this
                # group, training on would only make steps to lose.
                self._report(metrics, with_checkpoint=True, reason="resize")
                self.interruptions.wait_for_resize(self.step)
            elif at_ckpt or overdue:
                self._report(metrics, with_checkpoint=True, reason="interval" if at_ckpt else "time")

    # --- finish --------------------------------------------------------------------------

    def finish(self) -> None:
        metrics: dict[str, float] = {
            "step": self.step, "final": 1.0, "world_size": self.world_size,
            # How many linear layers hold 4-bit base weights (QLoRA); 0 otherwise.
            "quantized_linear_layers": sum(
                type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes")
                for m in self.strategy.module.modules()
            ),
        }
        self.evaluation.at_finish(self.step, metrics)
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
