"""`GET /jobs/{id}/manifest`: the `eft_manifest.json` of a succeeded job's artifact."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.service.errors import Conflict
from eft.training import storage
from eft.training.artifacts import MANIFEST

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("/{job_id}/manifest")
def job_manifest(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> dict[str, Any]:
    """The artifact's manifest (base model and hash, dataset hash, hyperparameters, strategy,
    final metrics, versions), read from wherever the artifact is (a directory or an object
    store). 409 until the job has written its artifact."""
    job = service.store.get_job(job_id, tenant)
    text = None
    if job.artifact_path:
        place = storage.resolve(job.artifact_path).child(MANIFEST)
        text = storage.read_text(place.filesystem, place.path)
    if text is None:
        raise Conflict(f"job {job_id} is {job.status.value} and has no artifact yet; the manifest "
                       "is written when it succeeds", code="manifest_not_available", param="job_id")
    return json.loads(text)
