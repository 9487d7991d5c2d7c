"""The training loop reads a delivered preemption notice from the worker's own Ray Train context
(no round trip to Ray Train's synchronization actor). Pure logic: the context is Ray's own
dataclass, filled in here, so a Ray release that moves the notice fails this test."""

import dataclasses

import pytest
from eft.training._ray import train_context
from eft.training._ray import PreemptionContext
from ray.train.v2.api.preemption import PreemptionInfo

from eft.training.interruptions import delivered_preemption_notice


@pytest.fixture
def worker_context():
    fields = {f.name: None for f in dataclasses.fields(train_context.TrainContext) if f.init}
    ctx = train_context.TrainContext(**{**fields, "preemption_context": PreemptionContext()})
    train_context.set_train_context(ctx)
    yield ctx
    train_context.set_train_context(None)


def test_no_notice_until_the_watcher_delivers_one(worker_context):
    # execution_context (which holds the synchronization actor) is None here: any round
    # trip through it would raise instead of answering.
    assert worker_context.execution_context is None
    assert delivered_preemption_notice() is None


def test_the_delivered_notice_is_read_locally(worker_context):
    notice = PreemptionInfo(deadline_ms=1_700_000_000_000, preempted_node_to_ranks={"node-a": [1]})
    worker_context.preemption_context.preemption_info = notice  # what `mark_preempt` does
    assert delivered_preemption_notice() is notice
