"""Jobs put straight into a real job store, in the states the service would have brought them to."""

from __future__ import annotations

from eft.service.store.store import Store
from eft.types.jobs import JobStatus


def running_job(store: Store, tenant: str = "t", total_steps: int = 4, attempt: int = 1) -> str:
    """A job validated, queued and dispatched as `attempt`: what a training attempt reports into.
    Returns its id."""
    job = store.create_job(tenant=tenant, request={})
    store.transition(job.id, JobStatus.queued, "validated", total_steps=total_steps)
    store.transition(job.id, JobStatus.running, "dispatched", attempt=attempt)
    return job.id
