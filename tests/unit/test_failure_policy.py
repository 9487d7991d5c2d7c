"""The job's failure policy on Ray Train's own error types (pure logic, no cluster)."""

from ray.train import FailureConfig
from eft.training._ray import PreemptingState, RunningState
from eft.training._ray import FailureDecision
from ray.train.v2.api.exceptions import WorkerGroupError
from ray.train.v2.api.preemption import PreemptionInfo

from eft.training.driver import JobFailurePolicy
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
