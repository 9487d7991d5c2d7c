"""`/jobs/{id}/artifacts`: download what a job wrote, through the API, from wherever it is
stored (service/serving/downloads.py). The list gives each file's size and SHA-256; each file streams
with its `Content-Length` and its SHA-256 in `X-Content-SHA256`. `/jobs/{id}/export` writes a
merged model (service/serving/exports.py), downloaded the same way with `?export=merged`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from fastapi.responses import StreamingResponse

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.service.serving.downloads import list_files, open_file
from eft.types.jobs import ArtifactFile, ArtifactFileList, Export, ExportCreate, ExportList

router = APIRouter(prefix="/jobs", tags=["jobs"])
Checkpoint = Annotated[int | None, Query(ge=0, description="A kept checkpoint's step; the published artifact when left out.")]
ExportKind = Annotated[Literal["merged"] | None, Query(description="A finished export's files instead (POST /jobs/{id}/export).")]


@router.get("/{job_id}/artifacts", response_model=ArtifactFileList)
def list_artifact_files(job_id: str, service: JobServiceDep, tenant: CurrentTenant,
                        checkpoint: Checkpoint = None, export: ExportKind = None) -> ArtifactFileList:
    """The files of the job's artifact (once it succeeded), of a kept checkpoint, or of a
    finished export: 409 `artifact_not_available` before the job succeeded (and
    `export_not_available` before the export is written), 404 for a checkpoint it does not keep."""
    files = list_files(service.artifact_location(job_id, tenant, checkpoint, export))
    return ArtifactFileList(job_id=job_id, checkpoint=checkpoint, export=export,
                            data=[ArtifactFile(**f) for f in files])


@router.get("/{job_id}/artifacts/{path:path}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
def download_artifact_file(job_id: str, path: str, service: JobServiceDep, tenant: CurrentTenant,
                           checkpoint: Checkpoint = None, export: ExportKind = None) -> StreamingResponse:
    """One file's bytes, streamed; 404 `artifact_not_found` for a path the list does not have."""
    entry, chunks = open_file(service.artifact_location(job_id, tenant, checkpoint, export), path)
    return StreamingResponse(chunks, media_type="application/octet-stream", headers={
        "Content-Length": str(entry["bytes"]), "X-Content-SHA256": entry["sha256"],
        "Content-Disposition": f'attachment; filename="{path.rsplit("/", 1)[-1]}"'})


@router.post("/{job_id}/export", response_model=Export, status_code=202)
def export_model(job_id: str, service: JobServiceDep, tenant: CurrentTenant, response: Response,
                 body: ExportCreate | None = None) -> Export:
    """Export a succeeded job's model: `merged` (base + adapter in the base model's dtype, as
    safetensors with tokenizer and config; written by a Ray Job next to the artifact) or
    `adapter`. 202 with the export while it runs; 200 with the one already running or written;
    409 `job_not_succeeded` naming the job's status otherwise. With `hub_repo`, the Ray Job
    also pushes it to that Hugging Face Hub repository with the operator's token (400
    `hub_token_missing` when the operator gave none)."""
    body = body or ExportCreate()
    export, started = service.exports.start(job_id, tenant, body.kind, body.hub_repo, body.hub_private)
    if not started and export["status"] == "succeeded":
        response.status_code = 200
    return Export(**export)


@router.get("/{job_id}/exports", response_model=ExportList)
def list_exports(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> ExportList:
    """The job's exports, oldest first: its adapter, then each merged export with its status."""
    return ExportList(data=[Export(**e) for e in service.exports.list(job_id, tenant)])
