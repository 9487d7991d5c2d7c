"""Every allowed and every forbidden status edge of the job lifecycle."""

import itertools

import pytest

from eft.types.jobs import JobStatus
from eft.service.jobs import lifecycle
from eft.service.jobs.lifecycle import IllegalTransition, plan_transition

S = JobStatus
EXPECTED_EDGES = {
    (S.validating, S.queued), (S.validating, S.failed), (S.validating, S.cancelled),
    (S.queued, S.running), (S.queued, S.failed), (S.queued, S.cancelled),
    (S.running, S.queued), (S.running, S.succeeded), (S.running, S.failed),
    (S.running, S.cancelling), (S.running, S.cancelled),
    (S.cancelling, S.cancelled), (S.cancelling, S.succeeded), (S.cancelling, S.failed),
    # pause and resume
    (S.queued, S.paused), (S.running, S.pausing),
    (S.pausing, S.paused), (S.pausing, S.succeeded), (S.pausing, S.failed), (S.pausing, S.cancelling),
    (S.pausing, S.cancelled), (S.paused, S.queued), (S.paused, S.cancelled),
}
ALL_PAIRS = list(itertools.product(JobStatus, JobStatus))


def test_every_status_has_rules():
    assert set(lifecycle.ALLOWED) == set(JobStatus)
    assert set(lifecycle.EVENT_FOR) == set(JobStatus)


@pytest.mark.parametrize("current,target", sorted(EXPECTED_EDGES, key=str))
def test_allowed_edge_plans_an_event(current, target):
    change = plan_transition(current, target, "because")
    assert (change.current, change.target) == (current, target)
    assert change.event_type == lifecycle.EVENT_FOR[target]
    assert change.message == "because"
    assert change.level == ("error" if target is S.failed else "info")


@pytest.mark.parametrize(
    "current,target", [p for p in ALL_PAIRS if p not in EXPECTED_EDGES], ids=str
)
def test_forbidden_edge_raises(current, target):
    with pytest.raises(IllegalTransition) as info:
        plan_transition(current, target)
    assert info.value.current is current and info.value.target is target
    assert current.value in str(info.value) and target.value in str(info.value)


def test_terminal_statuses_have_no_way_out():
    assert lifecycle.TERMINAL == {S.succeeded, S.failed, S.cancelled}
    assert all(s.is_terminal for s in lifecycle.TERMINAL)
    assert not any(s.is_terminal for s in set(JobStatus) - lifecycle.TERMINAL)


def test_event_type_and_data_can_be_overridden():
    change = plan_transition(S.running, S.queued, "node lost", event_type="requeued", data={"x": 1})
    assert change.event_type == "requeued" and change.data == {"x": 1}
