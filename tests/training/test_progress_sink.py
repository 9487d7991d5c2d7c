"""The progress sink, the actor through which a job's workers and controller report to the service
(training/progress.py), as a real Ray actor on the shared local Ray, over a real store.

Run: .venv/bin/python -m pytest tests/training/test_progress_sink.py -q
"""

from __future__ import annotations

from eft.service.runs.reporter import StoreReporter
from eft.service.store.store import Store
from tests.helpers.store import running_job


def test_the_progress_sink_counts_a_groups_checkpoint_requests_and_its_worker_time(database_url, ray_cluster):
    """The controller's checkpoint requests are counted from the start of the worker group
    they are for (one made for the group before never reaches the next), and the worker time
    a group holds lands on the job with its steps."""
    import ray

    from eft.training.progress import ProgressSink
    from eft.training.reporting import RunSpec

    store = Store(database_url)
    job_id = running_job(store)
    sink = ProgressSink.remote(StoreReporter(database_url, job_id, 1), RunSpec(job_id=job_id, attempt=1, tenant="t"),
                               {"job_id": job_id})
    ray.get(sink.group_started.remote(2))
    assert ray.get(sink.request_checkpoint.remote()) == 1
    assert ray.get(sink.control.remote()) == (False, 1)  # this group's: to be served
    # The group resizes; the next one starts: the request was the last group's.
    ray.get(sink.group_started.remote(1))
    assert ray.get(sink.control.remote()) == (False, 0)
    ray.get(sink.request_checkpoint.remote())
    assert ray.get(sink.control.remote()) == (False, 1)
    ray.get(sink.record.remote(1, {"loss": 2.0, "world_size": 1}))
    ray.get(sink.close.remote())
    job = store.get_job(job_id)
    assert job.step == 1 and job.worker_seconds > 0 and job.spot_worker_seconds == 0
    ray.kill(sink)
    store.close()
