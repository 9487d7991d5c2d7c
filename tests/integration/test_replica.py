"""One service replica's wiring (service/jobs/replica.py): the job service its routes call, the
scheduler with the validation it runs, the webhook sender, on one store; and its health, which
names what stopped.

Run: .venv/bin/python -m pytest tests/integration/test_replica.py -q
"""

from __future__ import annotations

import time

from eft.service.jobs.replica import Replica
from eft.service.requests.prepare import validate_job_isolated
from eft.service.settings import get_settings
from tests.helpers.fakes import RecordingLauncher
from tests.helpers.jobs import until


def _stop(replica: Replica) -> None:
    replica.stop()
    for thread in replica.threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in replica.threads)


def test_a_replica_wires_its_rooms_and_names_the_thread_that_stopped(eft_home):
    settings = get_settings().model_copy(update={"scheduler_interval_s": 0.05, "webhook_poll_interval_s": 0.05})
    launcher = RecordingLauncher()
    replica = Replica(settings, launcher=launcher)
    # A created job wakes this replica's scheduler, which validates with the request's own stages;
    # routes, scheduler and sender share one store and one launcher.
    assert replica.job_service.on_created == replica.scheduler.wake
    assert replica.scheduler.validate is validate_job_isolated
    assert replica.job_service.store is replica.scheduler.store
    assert replica.job_service.launcher is launcher is replica.scheduler.launcher
    assert replica.webhooks.engine is replica.job_service.store.engine
    assert [thread.is_alive() for thread in replica.threads] == [False, False]
    replica.start(warm_helpers=False)
    try:
        assert replica.problem() is None
        replica.scheduler.stop()
        replica.threads[0].join(timeout=30)
        assert replica.problem() == "the eft-scheduler thread stopped"
    finally:
        _stop(replica)


def test_a_sender_that_made_no_pass_in_a_while_makes_the_replica_unhealthy(eft_home):
    # A sender past its first pass waits an hour for the next: alive, but not turning.
    settings = get_settings().model_copy(update={"webhook_poll_interval_s": 3600.0})
    replica = Replica(settings, launcher=RecordingLauncher())
    before = replica.webhooks.last_pass
    replica.start(warm_helpers=False)
    try:
        until("the sender's first pass", lambda: replica.webhooks.last_pass > before, timeout_s=30)
        assert replica.problem() is None
        replica.webhooks.last_pass = time.monotonic() - 100_000  # its next pass is an hour away
        assert replica.problem() == "the webhook sender has not made a pass in a while"
    finally:
        _stop(replica)
