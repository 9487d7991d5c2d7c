"""The job's failure policy on Ray Train's own error types (pure logic, no cluster)."""

from ray.train import FailureConfig
from eft.training._ray import PreemptingState, RunningState
from eft.training._ray import FailureDecision
from ray.train.v2.api.exceptions import WorkerGroupError
from ray.train.v2.api.preemption import PreemptionInfo

from eft.training.controller import JobFailurePolicy
from eft.training.errors import TrainingUserError


def _worker_error(exc: Exception) -> WorkerGroupError:
    return WorkerGroupError("worker failed", {0: exc})


def test_user_errors_are_never_retried():
    policy = JobFailurePolicy(FailureConfig(max_failures=5))
    error = _worker_error(TrainingUserError("user_error.nan_loss", "the loss became nan", "x"))
    assert policy.make_decision(error) is FailureDecision.RAISE


def test_platform_errors_retry_up_to_the_budget():
    policy = JobFailurePolicy(FailureConfig(max_failures=2))
    decisions = [policy.make_decision(_worker_error(RuntimeError("worker lost"))) for _ in range(3)]
    assert decisions == [FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]


def test_a_worker_lost_during_a_drain_is_a_preemption_not_a_failure():
    policy = JobFailurePolicy(FailureConfig(max_failures=0, max_preemption_failures=-1))
    notice = PreemptingState(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n": [1]}), 0.0)
    for _ in range(3):
        policy.after_controller_state_update(RunningState(), notice)
        assert policy.make_decision(_worker_error(RuntimeError("actor died"))) is FailureDecision.RETRY
        policy.after_controller_state_update(notice, RunningState())
    # Outside a drain the same error counts against max_failures (0 here).
    assert policy.make_decision(_worker_error(RuntimeError("actor died"))) is FailureDecision.RAISE


def test_an_early_restart_after_a_preemption_notice_sizes_the_group_without_the_draining_node():
    """Workers of an elastic job end once their preemption checkpoint is in
    (`PreemptionCheckpointed`): the error is the preemption (no failure budget), and the
    restarted group counts only the nodes that stay, until the drained one is surely gone."""
    import time

    from ray.train import ScalingConfig

    from eft.training import controller as driver
    from eft.training.controller import LosslessResize
    from eft.training.errors import PreemptionCheckpointed

    driver.DRAINING.clear()
    policy = JobFailurePolicy(FailureConfig(max_failures=0, max_preemption_failures=-1))
    deadline_ms = (time.time() + 30) * 1000
    notice = PreemptingState(PreemptionInfo(deadline_ms=deadline_ms, preempted_node_to_ranks={"b": [1]}), 0.0)
    policy.after_controller_state_update(RunningState(), notice)
    assert policy.make_decision(_worker_error(PreemptionCheckpointed("checkpointed"))) is FailureDecision.RETRY
    assert driver.DRAINING["b"] == deadline_ms / 1000 + driver.DRAIN_GRACE_S

    resize = LosslessResize(ScalingConfig(num_workers=(1, 3), resources_per_worker={"CPU": 1}), None, "job")
    reserved = {"a": {"CPU": 1.0}, "b": {"CPU": 1.0}, "c": {"CPU": 1.0}}
    assert resize._count_possible_workers(reserved) == 2  # "b" is draining: a and c
    driver.DRAINING["b"] = time.time() - 1  # past its deadline and grace: gone, forgotten
    assert resize._count_possible_workers(reserved) == 3 and "b" not in driver.DRAINING
