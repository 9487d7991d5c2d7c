"""What a job attempt runs inside Ray Train's controller: callbacks that report checkpoints and
the controller's state changes (restarted, resized, preempted) through the job's reporter, the
failure policy that never retries a user error, the elastic policy that resizes only through a
checkpoint, and the preemption watcher as a thread of the controller. `training/driver.py` hands
them to the trainer."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import ray
import ray.train
from ray.train import FailureConfig, ScalingConfig
from ray.train.v2.api.exceptions import PreemptionError

from eft.training._ray import (
    DEFAULT_ENABLE_PREEMPTION_WATCHER,
    ENABLE_PREEMPTION_WATCHER_ENV_VAR,
    ControllerCallback,
    DefaultFailurePolicy,
    ElasticScalingPolicy,
    FailureDecision,
    NoopDecision,
    PreemptingState,
    PreemptionCallback,
    PreemptionWatcher,
    ReschedulingState,
    ResizeDecision,
    ResizingState,
    RestartingState,
    SchedulingState,
    env_bool,
)
from eft.training import storage
from eft.training import checkpoint as ckpt
from eft.training import telemetry
from eft.training.errors import find_user_error
from eft.training.reporting import Reporter, RunSpec

log = logging.getLogger("eft.driver")

# Whether Ray Train should watch for preemptions, as this process was started (JobTrainer then
# turns Ray's own watcher actor off and runs the watcher in the controller).
WATCH_PREEMPTIONS = env_bool(ENABLE_PREEMPTION_WATCHER_ENV_VAR, DEFAULT_ENABLE_PREEMPTION_WATCHER)
#: How long a callback keeps retrying a report while the job store is unreachable.
REPORT_PATIENCE_S = 60.0


class _Reporting:
    """Callbacks run in the Train controller: they report through the job's reporter, and make
    their telemetry there, not in the driver."""

    def __init__(self, reporter: Reporter, spec: RunSpec, config: dict[str, Any]):
        self.reporter, self.spec, self.config = reporter, spec, config
        self._telemetry: telemetry.JobTelemetry | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_telemetry": None}

    @property
    def telemetry(self) -> telemetry.JobTelemetry:
        if self._telemetry is None:
            self._telemetry = telemetry.for_run(self.spec, self.config)
        return self._telemetry

    def report(self, what: str, call: Callable[[], Any]) -> Any:
        """Make one report, retried with backoff for up to REPORT_PATIENCE_S while the job
        store is unreachable; then logged and dropped. A callback that raised would fail the
        controller and cost the job a restart, for bookkeeping the training does not need."""
        deadline = time.monotonic() + REPORT_PATIENCE_S
        delay = 0.5
        while True:
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - the store's errors, whatever its driver
                if time.monotonic() + delay > deadline:
                    log.warning("could not record %s for job %s; dropped: %s", what, self.spec.job_id, exc)
                    return None
                log.warning("recording %s for job %s failed, retrying in %.1fs: %s", what, self.spec.job_id, delay, exc)
                time.sleep(delay)
                delay = min(delay * 2, 8.0)


#: Resize checkpoints the Train controller has registered, per job: `RecordCheckpoints` (a
#: callback) counts them and `LosslessResize` (the scaling policy) waits for one, both in the
#: controller's process.
RESIZE_CHECKPOINTS: dict[str, int] = {}
#: The cluster scheduler's decision behind each job's pending resize, as `LosslessResize` read
#: it when it decided (the `resized` event names its reason and the job that needed the room).
DECIDED: dict[str, dict[str, Any]] = {}
#: Nodes being drained (a preemption notice), with the time (epoch s) past which they are
#: surely gone: Ray still lists them alive and their resources free until then, but places
#: nothing new on them. `JobFailurePolicy` records them, `LosslessResize` counts without them.
DRAINING: dict[str, float] = {}
#: How long after its deadline a drained node is still left out (it may take that long to go).
DRAIN_GRACE_S = 60.0


def _draining_now() -> set[str]:
    now = time.time()
    for node in [n for n, until in DRAINING.items() if until < now]:
        del DRAINING[node]
    return set(DRAINING)


class LosslessResize(ElasticScalingPolicy):
    """Ray Train's elastic policy, except that a resize of a running worker group first asks
    the workers for a checkpoint (through the progress sink; they take it at their next check,
    about a second of training) and resizes once the controller has registered it: the new
    group resumes where the old one stopped, so no resize loses a step. Without the checkpoint
    within `wait_s` (a worker stuck), it resizes from the latest one, as Ray Train would.

    It also keeps to the cluster scheduler's size for the job (`eft.service.scheduling.scheduler`): never
    more workers than the scheduler gives it, and a shrink to that size when the scheduler takes
    room back for another job (never below the job's minimum)."""

    LIMIT_READ_S = 2.0

    def __init__(self, scaling_config: ScalingConfig, sink: Any, job_id: str, wait_s: float = 60.0):
        super().__init__(scaling_config)
        self.sink, self.job_id, self.wait_s = sink, job_id, wait_s
        self._pending: Any = None
        self._asked_at = 0.0
        self._registered = 0
        self._group_started: float | None = None
        self._limit: int | None = None
        self._limit_read = float("-inf")
        self._limit_read_as: dict[str, Any] | None = None

    def _current_limit(self) -> int | None:
        """The scheduler's size, read from the sink at most every `LIMIT_READ_S`."""
        if self.sink is not None and time.monotonic() - self._limit_read >= self.LIMIT_READ_S:
            self._limit_read = time.monotonic()
            try:
                limit = ray.get(self.sink.worker_limit.remote(), timeout=5)
            except Exception:  # noqa: BLE001 - keep the last size read
                log.warning("could not read %s's size from the scheduler", self.job_id, exc_info=True)
            else:
                self._limit = None if not limit else max(self.scaling_config.min_workers, int(limit["workers"]))
                self._limit_read_as = limit
        return self._limit

    def _capped(self, decision: Any, current: int | None = None) -> Any:
        limit = self._current_limit()
        if not isinstance(decision, ResizeDecision) or limit is None or decision.num_workers <= limit:
            return decision
        if current is not None and limit == current:
            return NoopDecision()
        return self._get_resize_decision(limit)

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        # A draining node takes no new worker: an early restart after a preemption notice
        # (training/loop.py `_leave_for_preemption`) sizes the group on the nodes that stay.
        draining = _draining_now()
        return super()._count_possible_workers(
            {node: res for node, res in reserved_resources.items() if node not in draining})

    def make_decision_for_non_running_worker_group(self):  # noqa: ANN201
        return self._capped(super().make_decision_for_non_running_worker_group())

    def make_decision_for_running_worker_group(self, worker_group_state, worker_group_status):  # noqa: ANN001, ANN201
        if self._pending is not None and worker_group_state.start_time != self._group_started:
            self._pending = None  # the group restarted meanwhile: that decision is stale
        if self._pending is None:
            limit = self._current_limit()
            if limit is not None and worker_group_state.num_workers > limit:
                decision = self._get_resize_decision(limit)  # the scheduler took room back
            else:
                decision = self._capped(super().make_decision_for_running_worker_group(
                    worker_group_state, worker_group_status), worker_group_state.num_workers)
            if not isinstance(decision, ResizeDecision):
                return decision
            if self._limit_read_as and decision.num_workers == self._limit:
                DECIDED[self.job_id] = dict(self._limit_read_as)  # the scheduler's sizing
            else:
                DECIDED.pop(self.job_id, None)  # Ray Train's own (the cluster changed)
            self._pending, self._asked_at = decision, time.monotonic()
            self._group_started = worker_group_state.start_time
            self._registered = RESIZE_CHECKPOINTS.get(self.job_id, 0)
            try:
                ray.get(self.sink.request_checkpoint.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - no sink: resize as Ray Train would
                log.exception("could not ask %s's workers for a checkpoint before resizing", self.job_id)
                self._asked_at = float("-inf")
            log.info("resize to %s workers waits for a checkpoint", decision.num_workers)
            return NoopDecision()
        if (RESIZE_CHECKPOINTS.get(self.job_id, 0) > self._registered
                or time.monotonic() - self._asked_at > self.wait_s):
            decision, self._pending = self._pending, None
            return decision
        return NoopDecision()


class RecordCheckpoints(_Reporting, ray.train.UserCallback):
    """Records every checkpoint Ray Train has persisted, with its size and why it was taken.
    (Per-step metrics take another path: training/progress.py.)"""

    def __init__(self, reporter: Reporter, spec: RunSpec, config: dict[str, Any]):
        super().__init__(reporter, spec, config)
        self.checkpoint_root = config.get("checkpoint_root", "")

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:  # noqa: ANN001
        if checkpoint is None:
            return
        values = {k: float(v) for k, v in metrics[0].items() if isinstance(v, (int, float))}
        step = int(values.get("step", 0))
        # The checkpoint may be in an object store: read it through its own filesystem.
        fs = checkpoint.filesystem
        text = storage.read_text(fs, f"{checkpoint.path}/{ckpt.STATE_FILE}")
        state = json.loads(text) if text else {}
        size = storage.size_bytes(fs, checkpoint.path) or None
        path = _checkpoint_uri(self.checkpoint_root, checkpoint.path)
        reason = state.get("reason", "interval")
        world_size = state.get("world_size")
        if reason == "resize":  # keyed by the run (the job's config), as LosslessResize reads it
            run = self.config.get("job_id", "")
            RESIZE_CHECKPOINTS[run] = RESIZE_CHECKPOINTS.get(run, 0) + 1
        self.report("checkpoint", lambda: self.reporter.checkpoint(
            step, path, values, world_size=world_size, reason=reason, size_bytes=size,
            save_seconds=state.get("save_seconds")))
        self.telemetry.checkpoint(reason, state.get("save_seconds"), size)
        self.report("checkpoint event", lambda: self.reporter.event(
            "checkpoint_saved", f"{reason} checkpoint saved at step {step}",
            {"step": step, "path": path, "reason": reason, "world_size": world_size,
             "size_bytes": size, "save_seconds": state.get("save_seconds")},
        ))


def _checkpoint_uri(checkpoint_root: str, path: str) -> str:
    """A checkpoint's path as users see it: the object-store URI when the root is one."""
    if not checkpoint_root or not storage.is_remote(checkpoint_root):
        return path
    return storage.resolve(checkpoint_root).uri_of(path)


class RecordRecovery(_Reporting, ControllerCallback):
    """Turns the Train controller's state changes into job events and counters: `preempted`
    when a node hosting workers is drained, `restarted` when the worker group restarts after a
    failure, `resized` when an elastic job changes its number of workers. (`resumed`, with the
    step and lost steps, comes from rank 0 once it has loaded the checkpoint.)"""

    def __init__(self, reporter: Reporter, spec: RunSpec, config: dict[str, Any]):
        super().__init__(reporter, spec, config)
        self.num_workers: int | None = None

    def _event(self, type_: str, message: str, data: dict[str, Any], level: str = "info") -> None:
        try:
            self.reporter.event(type_, message, data, level=level)
        except Exception:  # noqa: BLE001 - bookkeeping must never break the controller
            log.exception("could not record %s for %s", type_, self.spec.job_id)

    def after_controller_state_update(self, previous_state, current_state) -> None:  # noqa: ANN001
        try:
            self._on_state(previous_state, current_state)
        except Exception:  # noqa: BLE001
            log.exception("could not record a state change of %s", self.spec.job_id)

    def _on_state(self, previous_state, current_state) -> None:  # noqa: ANN001
        if isinstance(current_state, PreemptingState):
            if isinstance(previous_state, PreemptingState):
                return  # still waiting out the same preemption
            info = current_state.preemption_info
            self.reporter.counts(preemptions=1)
            self.telemetry.counts(preemptions=1)
            self._event("preempted", f"node(s) {', '.join(n[:12] for n in info.preempted_node_ids)} "
                        f"draining; checkpointing before they go", {
                            "nodes": info.preempted_node_ids, "ranks": info.preempted_ranks,
                            "deadline_ms": info.deadline_ms, "world_size": self.num_workers,
                        }, level="warning")
        elif isinstance(current_state, RestartingState):
            error = current_state.training_failed_error
            # A worker lost while its node drains is the preemption, whatever the error says.
            preemption = isinstance(error, PreemptionError) or isinstance(previous_state, PreemptingState)
            if not preemption:
                self.reporter.counts(restarts=1)
                self.telemetry.counts(restarts=1)
            reason = "preemption" if preemption else _first_line(error)
            self._event("restarted", f"restarting from the latest checkpoint after: {reason}",
                        {"reason": reason, "world_size": self.num_workers,
                         "error_type": type(error).__name__}, level="warning")
        elif isinstance(current_state, ResizingState):
            target = current_state.scaling_decision.num_workers
            self.reporter.counts(resizes=1)
            self.telemetry.counts(resizes=1)
            data = {"from_workers": self.num_workers, "to_workers": target,
                    "reason": "shrink" if self.num_workers is not None and target < self.num_workers else "grow"}
            limit = DECIDED.pop(self.config.get("job_id", ""), None)
            if limit and limit.get("workers") == target:  # the scheduler's decision: say why
                data.update(scheduler_reason=limit.get("reason"), because_of=limit.get("because_of"))
            because = f" to make room for {data['because_of']}" if data.get("because_of") else ""
            self._event("resized", f"resizing from {self.num_workers} to {target} workers{because}", data)
        elif isinstance(current_state, SchedulingState):
            target = current_state.scaling_decision.num_workers
            if (isinstance(previous_state, (RestartingState, ReschedulingState))
                    and self.num_workers is not None and target != self.num_workers):
                self.reporter.counts(resizes=1)
                self.telemetry.counts(resizes=1)
                self._event("resized", f"restarting with {target} instead of {self.num_workers} workers",
                            {"from_workers": self.num_workers, "to_workers": target,
                             "reason": "shrink" if target < self.num_workers else "grow"})
            self.num_workers = target


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


class JobFailurePolicy(DefaultFailurePolicy, ControllerCallback):
    """Ray Train's failure policy, except that a user error (bad data, NaN loss, out of
    memory) is raised at once, since retrying it would fail the same way, and that a worker
    lost while its node was being drained counts as the preemption it is (against no budget),
    not as a failure against `max_restarts`."""

    def __init__(self, failure_config: FailureConfig):
        super().__init__(failure_config)
        self._preempting: PreemptingState | None = None

    def after_controller_state_update(self, previous_state, current_state) -> None:  # noqa: ANN001
        if isinstance(current_state, PreemptingState):
            self._preempting = current_state
            info = current_state.preemption_info
            until = (info.deadline_ms / 1000.0 if info.deadline_ms else time.time() + 120.0) + DRAIN_GRACE_S
            for node in info.preempted_node_ids:
                DRAINING[node] = max(DRAINING.get(node, 0.0), until)
        elif not isinstance(current_state, RestartingState):
            self._preempting = None

    def make_decision(self, training_failed_error) -> FailureDecision:  # noqa: ANN001
        if find_user_error(training_failed_error) is not None:
            return FailureDecision.RAISE
        if self._preempting is not None and not isinstance(training_failed_error, PreemptionError):
            training_failed_error = PreemptionError(
                preemption_info=self._preempting.preemption_info, drain_timed_out=False
            )
        return super().make_decision(training_failed_error)


class InControllerPreemptionWatch(PreemptionCallback):
    """Ray Train's preemption watch with its watcher in the controller's process instead of an
    actor of its own. The watcher is a poll thread (drained nodes from the GCS, every
    `RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S`) that hands a notice to every worker
    (`mark_preempt`); it holds nothing a process of its own would protect, and the controller
    outlives every worker group it watches."""

    def after_worker_group_start(self, worker_group: Any) -> None:
        self._stop_watcher()
        node_to_ranks: dict[str, list[int]] = {}
        actors: dict[int, Any] = {}
        for worker in worker_group.get_workers():
            rank = worker.distributed_context.world_rank
            node_to_ranks.setdefault(worker.metadata.node_id, []).append(rank)
            actors[rank] = worker.actor
        self._watcher = PreemptionWatcher(node_to_ranks=node_to_ranks, poll_interval_s=self._poll_interval_s,
                                          worker_actors_by_rank=actors)

    def _stop_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher._stop_event.set()  # its poll thread ends within one interval  # noqa: SLF001

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into the controller before any worker group starts: no watcher yet.
        return {**self.__dict__, "_watcher": None}
