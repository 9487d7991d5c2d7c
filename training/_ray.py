"""Every private part of Ray the product relies on, in one place, against one tested Ray version.

Ray Train's public API has no hook for the job's own failure policy, for leaving out helper
processes, or for reading a delivered preemption notice without a round trip, so the driver and
the loop reach into `ray.train.v2._internal`; the local stack asks `ray._private` where the
recorded cluster is, and for the headers that carry the cluster's token; the scheduler reads each
node's free resources as Ray's dashboard and autoscaler do (`available_resources_per_node`). Those modules change between Ray releases: pyproject.toml pins Ray to
`TESTED_RAY_VERSION` and tests/unit/training/test_ray_internals.py checks both that pin and that nothing
outside this module imports a private Ray module.
"""

from __future__ import annotations

import ray
from ray._private import ray_constants
from ray._private.services import get_ray_address_from_environment
from ray._private.state import available_resources_per_node
from ray.train.v2._internal.callbacks import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2._internal.callbacks.preemption_callback import PreemptionCallback
from ray.train.v2._internal.constants import DEFAULT_ENABLE_PREEMPTION_WATCHER, ENABLE_PREEMPTION_WATCHER_ENV_VAR
from ray.train.v2._internal.execution import context as train_context
from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.train.v2._internal.execution.controller.state import (
    PreemptingState,
    ReschedulingState,
    ResizingState,
    RestartingState,
    RunningState,
    SchedulingState,
)
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
from ray.train.v2._internal.execution.scaling_policy import NoopDecision, ResizeDecision
from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy
from ray.train.v2._internal.execution.preemption import PreemptionContext, PreemptionWatcher

#: The Ray release (major.minor) these internals were read from and tested against.
TESTED_RAY_VERSION = "2.60"

__all__ = [
    "TESTED_RAY_VERSION", "available_resources_per_node", "ControllerCallback", "DatasetsCallback", "DEFAULT_ENABLE_PREEMPTION_WATCHER",
    "DefaultFailurePolicy", "ENABLE_PREEMPTION_WATCHER_ENV_VAR", "ElasticScalingPolicy", "FailureDecision",
    "NoopDecision", "ResizeDecision",
    "PlacementGroupCleanerCallback", "PreemptingState", "PreemptionCallback", "PreemptionContext",
    "PreemptionWatcher", "ReschedulingState", "ResizingState", "RestartingState", "RunningState",
    "SchedulingState", "env_bool", "get_ray_address_from_environment", "get_train_context",
    "ray_version_tested", "reports_in_flight", "train_context",
]


def env_bool(name: str, default: bool) -> bool:
    """A boolean from the environment, read the way Ray reads its own flags."""
    return ray_constants.env_bool(name, default)


def get_train_context():  # noqa: ANN201 - Ray Train's TrainContext of this worker
    """This Ray Train worker's own context (raises RuntimeError outside a worker)."""
    return train_context.get_train_context()


def reports_in_flight() -> int:
    """This worker's reports that the Train controller has not taken yet: made but not queued
    (an asynchronous checkpoint still persisting, or waiting its turn), or queued in the
    worker's one-slot result queue until the controller's next poll. 0 outside a worker."""
    try:
        ctx = train_context.get_train_context()
    except RuntimeError:
        return 0
    return max(0, ctx.report_call_index - ctx.current_report_index) + ctx.get_result_queue().qsize()


def dashboard_auth_headers() -> dict[str, str]:
    """The headers Ray's own SDK sends its dashboard: the cluster's token when token
    authentication is on (Ray 2.60 turns it on for a new local cluster), else none."""
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    return get_auth_headers_if_auth_enabled({})


def ray_version_tested() -> bool:
    """Whether the installed Ray is the release these internals were tested against."""
    return ray.__version__.rsplit(".", 1)[0] == TESTED_RAY_VERSION
