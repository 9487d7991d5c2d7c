"""Small stand-ins passed into the service's scheduler by the tests of its logic: a launcher that
records what it was asked instead of reaching Ray Jobs, a validation that accepts every job, and a
cluster whose capacity is unknown."""

from __future__ import annotations

import threading

from eft.service.runs.launcher import RayJobState, submission_id_for
from eft.training.config import TrainConfig


def unknown_capacity():
    """Capacity unknown: for tests about job limits and claims, whatever Ray this process may be
    connected to."""
    return None


class RecordingLauncher:
    """Ray Jobs as the scheduler sees it: submissions (a reused submission id is refused, as Ray
    refuses it), their states, stops and logs; `fail` makes every submit fail to connect."""

    def __init__(self, fail: bool = False):
        self.submitted: list[str] = []
        self.stopped: list[str] = []
        self.states: dict[str, str] = {}
        self.fail = fail
        self.lock = threading.Lock()

    def submit(self, job_id, attempt, name):
        if self.fail:
            raise ConnectionError("dashboard unreachable")
        sid = submission_id_for(job_id, attempt)
        with self.lock:
            if sid in self.states:  # Ray refuses a reused submission id
                return False
            self.submitted.append(sid)
            self.states[sid] = RayJobState.RUNNING
        return True

    def state(self, submission_id):
        return self.states.get(submission_id, RayJobState.MISSING)

    def stop(self, submission_id):
        self.stopped.append(submission_id)
        self.states[submission_id] = RayJobState.STOPPED

    def logs(self, submission_id):
        return "driver log tail"


def validate_ok(job, settings):
    """A validation that passes every job with a small training config."""
    cfg = TrainConfig(job_id=job.id, model_path="m", training_file="t", validation_file=None,
                      method="lora", lora=None, total_steps=5, num_train_examples=10)
    return cfg, {"train_examples": 10}
