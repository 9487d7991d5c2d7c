"""What interrupts a worker's training, as each rank sees it at a sync: a preemption notice (a
spot node draining), a checkpoint overdue by time, the job asked to pause, the Train controller
asking for a checkpoint before it resizes the worker group. The loop (`training/loop.py`) agrees
on them over ranks and acts; here is what each rank reads and how it then leaves or waits."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
import ray.train
import torch

from eft.training.collectives import all_reduce_sum
from eft.training.config import TrainConfig
from eft.training.errors import PreemptionCheckpointed

#: How long past the preemption deadline a worker waits to be stopped before giving up.
PREEMPTION_TEARDOWN_GRACE_S = 60.0
#: How long workers wait, after the checkpoint a resize asked for, for the resize to stop them.
RESIZE_WAIT_S = 90.0

log = logging.getLogger("eft.training.loop")


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


class Interruptions:
    def __init__(self, cfg: TrainConfig, rank: int, device: torch.device, sink: Any = None):
        self.cfg, self.rank, self.device, self.sink = cfg, rank, device, sink
        # Pause: rank 0 asks the progress sink at each check without waiting (one call in
        # flight); once asked, the workers checkpoint and stop.
        self.pause_seen, self._control_ref = False, None
        # Rank 0: checkpoint requests read from the sink, and those served (a resize waits for one).
        self.checkpoints_asked = self.checkpoints_served = 0

    def ask(self) -> None:
        """Rank 0 asks the sink, once the worker is set up: asked before the workers started?
        The answer is read at the first check after it comes (nothing waits for it here). The
        sink counts requests from this group's start (`group_started`): those made before were
        for the group before it."""
        if self.rank == 0 and self.sink is not None:
            self._control_ref = self.sink.control.remote()

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

    def checks(self, last_checkpoint_at: float) -> list[float]:
        """This rank's view at a sync: [a preemption notice, its deadline in ms (0 if none),
        the time-based checkpoint interval passed, the job asked to pause, the controller asked
        for a checkpoint before it resizes the worker group]; the loop maxes them over ranks."""
        notice = delivered_preemption_notice()
        overdue = bool(self.cfg.checkpoint_every_seconds) and (
            time.monotonic() - last_checkpoint_at >= self.cfg.checkpoint_every_seconds)
        pause, resize = self._control()
        return [float(notice is not None), float(notice.deadline_ms or 0) if notice else 0.0, float(overdue),
                float(pause), float(resize)]

    def leave_for_preemption(self, step: int) -> None:
        """An elastic job need not wait for the drained node to go: once every rank has handed
        its preemption report to Ray Train (the collective below: a rank reaches it only after
        its report is queued, and the controller reads a worker's queued report before its
        error), the group ends and Ray Train restarts it from that checkpoint on the nodes that
        stay (`LosslessResize` leaves draining nodes out). A fixed-size job keeps waiting: its
        workers would only wait for room elsewhere."""
        all_reduce_sum([1.0], self.device)
        raise PreemptionCheckpointed(
            f"checkpointed at step {step} on a preemption notice; the job goes on without the "
            "draining node(s)")

    def wait_out_preemption(self, deadline_ms: float) -> None:
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

    def wait_for_resize(self, step: int) -> None:
        """After the resize checkpoint (the request is served): wait for Ray Train to stop this
        worker group (it starts the resized one from that checkpoint). Should no resize come
        within RESIZE_WAIT_S (the controller changed its mind), training goes on from here.
        Every rank waits the same."""
        self.checkpoints_served = self.checkpoints_asked
        give_up_at = time.monotonic() + RESIZE_WAIT_S
        while time.monotonic() < give_up_at:
            time.sleep(0.2)
        log.warning("no resize came %.0f s after the resize checkpoint at step %s; training on",
                    RESIZE_WAIT_S, step)
