"""The job lifecycle: statuses, the allowed transitions, and the event each change records.

Pure Python, no web, Ray or database imports: the store's `transition` is the only caller that
changes a status, and it asks `plan_transition` first, so every edge is checked in one place and
every change leaves an event behind.

    validating -> queued -> running -> succeeded | failed | cancelled
                                    \\-> cancelling -> cancelled
                                    \\-> pausing -> paused -> queued (resume)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eft.types.jobs import JobStatus

S = JobStatus

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.validating: frozenset({S.queued, S.failed, S.cancelled}),
    S.queued: frozenset({S.running, S.failed, S.cancelled, S.paused}),
    # running -> queued: the job's Ray Job vanished (head lost, dispatch failed) and it is
    # dispatched again as a new attempt that resumes from its latest checkpoint.
    S.running: frozenset({S.queued, S.succeeded, S.failed, S.cancelling, S.cancelled, S.pausing}),
    # Asked to pause: the workers checkpoint and stop (paused); the job may still finish or
    # fail first, or be cancelled meanwhile.
    S.pausing: frozenset({S.paused, S.succeeded, S.failed, S.cancelling, S.cancelled}),
    # Resumed (queued again, to resume from its pause checkpoint) or cancelled.
    S.paused: frozenset({S.queued, S.cancelled}),
    # A job asked to stop may still finish or fail before the stop lands; both are recorded.
    S.cancelling: frozenset({S.cancelled, S.succeeded, S.failed}),
    S.succeeded: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
}

# The event type recorded for arriving in each status.
EVENT_FOR: dict[JobStatus, str] = {
    S.validating: "created",
    S.queued: "queued",
    S.running: "dispatched",
    S.pausing: "pause_requested",
    S.paused: "paused",
    S.cancelling: "cancel_requested",
    S.succeeded: "succeeded",
    S.failed: "failed",
    S.cancelled: "cancelled",
}

TERMINAL = frozenset(s for s, nxt in ALLOWED.items() if not nxt)


class IllegalTransition(Exception):
    """A status change the lifecycle does not allow."""

    def __init__(self, current: JobStatus, target: JobStatus):
        self.current, self.target = current, target
        allowed = ", ".join(sorted(s.value for s in ALLOWED[current])) or "none (terminal)"
        super().__init__(
            f"a job cannot go from {current.value} to {target.value}; allowed next: {allowed}"
        )


@dataclass(frozen=True)
class Transition:
    """A checked status change and the event that records it."""

    current: JobStatus
    target: JobStatus
    event_type: str
    message: str
    level: str = "info"
    data: dict[str, Any] = field(default_factory=dict)


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in ALLOWED[current]


def plan_transition(
    current: JobStatus,
    target: JobStatus,
    message: str | None = None,
    *,
    event_type: str | None = None,
    data: dict[str, Any] | None = None,
) -> Transition:
    """Check `current -> target` and describe its event.

    Returns the Transition to apply. Raises IllegalTransition when the edge is not allowed.
    """
    current, target = JobStatus(current), JobStatus(target)
    if not can_transition(current, target):
        raise IllegalTransition(current, target)
    level = "error" if target is S.failed else "info"
    return Transition(
        current=current,
        target=target,
        event_type=event_type or EVENT_FOR[target],
        message=message or f"job is {target.value}",
        level=level,
        data=dict(data or {}),
    )
