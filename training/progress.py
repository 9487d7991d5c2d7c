"""Per-step progress from rank 0 to the job store, off the training path.

`ray.train.report` is a barrier whose result the Train controller consumes on its poll
interval (seconds), so reporting every step would pace training by the controller. Metrics go
instead, fire-and-forget, to this small actor created by the driver; reports are kept for
checkpoints. Calls from one caller run in order, so rank 0 waits on its last call to be sure
every earlier one landed.
"""

from __future__ import annotations

import threading
import time

from typing import Any

import ray

from eft.training import telemetry
from eft.training.reporting import Reporter, RunSpec
from eft.training.trackers import trackers_for


#: The controller's and rank 0's questions (pause? checkpoint before a resize? the scheduler's
#: size?) run in their own thread: they never wait behind a backlog of per-step reports.
CONTROL = "control"


@ray.remote(num_cpus=0, max_restarts=3, max_task_retries=3, concurrency_groups={CONTROL: 1})
class ProgressSink:
    def __init__(self, reporter: Reporter, spec: RunSpec, config: dict[str, Any]):
        self.reporter = reporter
        # Checkpoints the controller asked for before a resize, and when it last asked; the
        # requests made before the current worker group started were for an earlier group.
        self.checkpoints_asked = 0
        self.asked_before_group = 0
        self.resize_asked_at: float | None = None
        self._lock = threading.Lock()
        # The furthest step trained so far, by this attempt or an earlier one: a resume from
        # an older checkpoint trains the steps in between again (lost steps).
        self.furthest, self.trained_tokens = reporter.position()
        self.telemetry = telemetry.for_run(spec, config)
        self.telemetry.last_step = self.furthest
        self.trackers = trackers_for(spec, config.get("artifact_root"))
        # Worker time: from a group's start (rank 0 says so before loading the model) to each
        # report, times its workers.
        self._held_since: float | None = None
        self._held_workers = 0

    @ray.method(concurrency_group=CONTROL)
    def group_started(self, world_size: int) -> None:
        """A worker group of `world_size` started (rank 0, before it loads the model): its
        worker time counts from now, and checkpoint requests count from here for it."""
        with self._lock:
            self.asked_before_group = self.checkpoints_asked
            seconds = self._held_seconds()
            self._held_since, self._held_workers = time.monotonic(), world_size
        if seconds:
            self._report_usage(seconds)

    def _held_seconds(self) -> float:
        """Worker-seconds held since the last count (under the lock)."""
        if self._held_since is None:
            return 0.0
        now = time.monotonic()
        seconds, self._held_since = (now - self._held_since) * self._held_workers, now
        return seconds

    def _report_usage(self, seconds: float) -> None:
        try:
            self.reporter.usage(seconds)
        except Exception:  # noqa: BLE001 - bookkeeping never stops training
            pass

    def record(self, step: int, values: dict[str, Any]) -> int:
        """Store one step's metrics and move the job's step counter. Returns the step."""
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float))}
        num_workers = int(numbers["world_size"]) if "world_size" in numbers else None
        with self._lock:
            if num_workers and self._held_since is None:  # a group that did not say when it started
                self._held_since, self._held_workers = time.monotonic(), num_workers
            seconds = self._held_seconds()
        # One write moves the step and counts the worker time (a stale attempt's are dropped).
        if self.reporter.step(step, num_workers, worker_seconds=seconds):
            self.trained_tokens += self.telemetry.step(step, numbers)
            numbers["trained_tokens"] = round(self.trained_tokens)
            self.reporter.metrics(step, numbers)
            self.furthest = max(self.furthest, step)
            for tracker in self.trackers:
                tracker.log(step, numbers)
        return step

    def reached(self, step: int) -> None:
        """Rank 0 finished `step` (metrics rows come later, read off the device in batches):
        the steps a restart trains again count from here."""
        self.furthest = max(self.furthest, step)

    def event(self, type_: str, message: str, data: dict[str, Any]) -> None:
        """An event of the job from rank 0 (an early stop, replies to validation prompts)."""
        self.reporter.event(type_, message, data)

    @ray.method(concurrency_group=CONTROL)
    def pause_requested(self) -> bool:
        """Whether the job was asked to pause (rank 0 asks at its checks, without waiting)."""
        return bool(self.reporter.pause_requested())

    @ray.method(concurrency_group=CONTROL)
    def request_checkpoint(self) -> int:
        """The controller asks for a checkpoint at the workers' next check (before a resize):
        returns the request's number."""
        with self._lock:
            self.checkpoints_asked += 1
            self.resize_asked_at = time.monotonic()
            return self.checkpoints_asked

    @ray.method(concurrency_group=CONTROL)
    def worker_limit(self) -> dict[str, Any] | None:
        """The scheduler's size for the job (the controller's scaling policy keeps to it)."""
        return self.reporter.worker_limit()

    @ray.method(concurrency_group=CONTROL)
    def control(self) -> tuple[bool, int]:
        """What rank 0 reads at its checks, without waiting: (asked to pause, checkpoint
        requests made since its worker group started)."""
        with self._lock:
            asked = self.checkpoints_asked - self.asked_before_group
        return bool(self.reporter.pause_requested()), asked

    def close(self) -> None:
        """Flush and close the trackers (the driver calls this before publishing)."""
        with self._lock:
            seconds = self._held_seconds()
            self._held_since = None
        if seconds:
            self._report_usage(seconds)
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def resumed(self, step: int, world_size: int, checkpoint_reason: str, load_seconds: float = 0.0) -> int:
        """Rank 0 restored a checkpoint at `step`. Records a `resumed` event with the steps
        that will be trained again. Returns the lost steps."""
        lost = max(0, self.furthest - step)
        if not self.reporter.resumed(step, world_size):
            return lost
        self.reporter.counts(lost_steps=lost)
        self.telemetry.counts(lost_steps=lost)
        data = {"step": step, "world_size": world_size, "lost_steps": lost,
                "checkpoint_reason": checkpoint_reason, "load_seconds": round(load_seconds, 4)}
        if checkpoint_reason == "resize" and self.resize_asked_at is not None:
            # What the resize cost: from the controller's decision (the checkpoint asked for)
            # to the resized group holding that checkpoint, ready to train.
            data["resize_pause_s"] = round(time.monotonic() - self.resize_asked_at, 3)
            self.resize_asked_at = None
        self.reporter.event(
            "resumed",
            f"resumed at step {step} with {world_size} worker(s) from a {checkpoint_reason} "
            f"checkpoint; {lost} step(s) to train again",
            data,
        )
        self.furthest = step
        self.telemetry.last_step = step
        return lost
