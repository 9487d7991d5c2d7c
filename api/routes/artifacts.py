"""`/jobs/{id}/artifacts`: download what a job wrote, through the API, from wherever it is
stored (service/downloads.py). The list gives each file's size and SHA-256; each file streams
with its `Content-Length` and its SHA-256 in `X-Content-SHA256`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.service.downloads import list_files, location_of, open_file
from eft.types.jobs import ArtifactFile, ArtifactFileList

router = APIRouter(prefix="/jobs", tags=["jobs"])
Checkpoint = Annotated[int | None, Query(ge=0, description="A kept checkpoint's step; the published artifact when left out.")]


def _location(service: JobServiceDep, job_id: str, tenant: str | None, checkpoint: int | None) -> str:
    job = service.store.get_job(job_id, tenant)
    return location_of(job, service.store.list_checkpoints(job.id) if checkpoint is not None else [], checkpoint)


@router.get("/{job_id}/artifacts", response_model=ArtifactFileList)
def list_artifact_files(job_id: str, service: JobServiceDep, tenant: CurrentTenant,
                        checkpoint: Checkpoint = None) -> ArtifactFileList:
    """The files of the job's artifact (once it succeeded) or of a kept checkpoint: 409
    `artifact_not_available` before the job succeeded, 404 for a checkpoint it does not keep."""
    files = list_files(_location(service, job_id, tenant, checkpoint))
    return ArtifactFileList(job_id=job_id, checkpoint=checkpoint, data=[ArtifactFile(**f) for f in files])


@router.get("/{job_id}/artifacts/{path:path}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
def download_artifact_file(job_id: str, path: str, service: JobServiceDep, tenant: CurrentTenant,
                           checkpoint: Checkpoint = None) -> StreamingResponse:
    """One file's bytes, streamed; 404 `artifact_not_found` for a path the list does not have."""
    entry, chunks = open_file(_location(service, job_id, tenant, checkpoint), path)
    return StreamingResponse(chunks, media_type="application/octet-stream", headers={
        "Content-Length": str(entry["bytes"]), "X-Content-SHA256": entry["sha256"],
        "Content-Disposition": f'attachment; filename="{path.rsplit("/", 1)[-1]}"'})
