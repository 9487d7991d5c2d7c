"""`GET /jobs/{id}/manifest`: the `eft_manifest.json` of a succeeded job's artifact."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from eft.api.deps import CurrentTenant, JobServiceDep

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("/{job_id}/manifest")
def job_manifest(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> dict[str, Any]:
    """The artifact's manifest (base model and hash, dataset hash, hyperparameters, strategy,
    final metrics, versions), read from wherever the artifact is (a directory or an object
    store). 409 until the job has written its artifact."""
    return service.manifest(job_id, tenant)
