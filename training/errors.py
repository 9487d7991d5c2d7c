"""Errors raised inside training that cross from Ray Train workers to the job driver.

They stay picklable (all state in `args`) so Ray can carry them between processes, and the
driver classifies a failure by type: a `TrainingUserError` fails the job with no retry, anything
else is a platform error.
"""

from __future__ import annotations


class TrainingUserError(Exception):
    """A problem with the job's inputs or settings found during training (bad data, NaN loss,
    out of memory for the chosen configuration). `code` starts with `user_error.`."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(code, message, param)

    @property
    def code(self) -> str:
        return self.args[0]

    @property
    def message(self) -> str:
        return self.args[1]

    @property
    def param(self) -> str | None:
        return self.args[2]

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class PreemptionCheckpointed(RuntimeError):
    """Raised by every worker of an elastic job once its preemption checkpoint is with Ray
    Train: the worker group ends at once instead of idling until the node's deadline, and the
    controller (in its preempting state, so it counts as the preemption) restarts it on the
    nodes that stay, from that checkpoint."""


def find_user_error(exc: BaseException | None) -> TrainingUserError | None:
    """The first TrainingUserError in an exception's cause/context chain, or in any worker's
    failure when it is Ray Train's error for a worker group (`worker_failures`), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TrainingUserError):
            return exc
        for failure in getattr(exc, "worker_failures", {}).values():
            found = find_user_error(failure)
            if found is not None:
                return found
        exc = exc.__cause__ or exc.__context__
    return None
