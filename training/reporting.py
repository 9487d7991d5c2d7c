"""How a job's training talks out: one protocol that training owns and the service implements.

Training (the Ray Job driver, the Train controller's callbacks, rank 0's progress actor) never
opens the service's store or reads its settings. It is handed a plain `RunSpec` and a
`Reporter`; the service implements the reporter over its job store (service/runs/reporter.py) and
wires both in the Ray Job's entrypoint (service/runs/entrypoint.py). A reporter is pickled into the
Train controller and into the progress actor, so it must open its connections lazily, in the
process that uses it.

Every write is fenced by the attempt: a reporter of a stale attempt (the job was requeued and a
newer attempt runs) answers False and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class RunSpec:
    """One attempt of a job as training sees it: who it is and where its telemetry goes."""

    job_id: str
    attempt: int
    tenant: str = "default"
    name: str | None = None
    #: Training FLOPs per token of the model and method (None: no MFU is reported).
    flops_per_token: float | None = None
    #: Peak FLOP/s of one worker, the denominator of MFU.
    peak_flops: float | None = None
    #: How often Ray Train's elastic policy looks for room to grow the worker group.
    resize_interval_s: float = 30.0
    #: Write TensorBoard event files next to the adapter.
    tensorboard: bool = False
    #: Log step metrics to this MLflow tracking URI (None: no MLflow run).
    mlflow_tracking_uri: str | None = None


class Reporter(Protocol):
    """What training tells the outside world about one attempt of a job."""

    def position(self) -> tuple[int, float]:
        """The furthest step trained so far by any attempt, and the tokens trained until then."""

    def started(self, min_workers: int, max_workers: int) -> None:
        """The attempt's driver is starting the trainer."""

    def step(self, step: int, num_workers: int | None, worker_seconds: float = 0.0) -> bool:
        """Rank 0 finished `step` with `num_workers` workers, which held `worker_seconds`
        (seconds x workers) since the last report. False: this attempt is stale."""

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Store one logged step's metrics (after `step` accepted it)."""

    def resumed(self, step: int, world_size: int) -> bool:
        """Rank 0 restored a checkpoint at `step`. False: this attempt is stale."""

    def checkpoint(self, step: int, path: str, values: dict[str, float], *, world_size: int | None,
                   reason: str, size_bytes: int | None, save_seconds: float | None) -> None:
        """Ray Train persisted a checkpoint at `path` (a path or object-store URI)."""

    def event(self, type_: str, message: str, data: dict[str, Any], level: str = "info") -> None:
        """Append an event to the job's timeline (preempted, restarted, resized, ...)."""

    def counts(self, **deltas: int) -> None:
        """Add to the job's recovery counters (restarts, preemptions, resizes, lost_steps)."""

    def succeeded(self, artifact_path: str, metrics: dict[str, float], step: int) -> bool:
        """The adapter is published. False: the job moved on (cancelled, requeued) meanwhile."""

    def pause_requested(self) -> bool:
        """Whether the job was asked to pause (checkpoint now and stop)."""

    def usage(self, worker_seconds: float) -> None:
        """The job's worker groups held `worker_seconds` (seconds x workers) more."""

    def worker_limit(self) -> dict[str, Any] | None:
        """The cluster scheduler's size for this job (`workers`, `reason`, `because_of`), which
        an elastic job keeps to; None: as many as the cluster gives, within its range."""

    def paused(self, step: int) -> bool:
        """The workers checkpointed at `step` and stopped on a pause request. False: the job
        moved on meanwhile."""

    def failed(self, code: str, message: str, param: str | None) -> None:
        """The attempt failed; `code` tells a user error (`user_error.*`) from a platform one."""
