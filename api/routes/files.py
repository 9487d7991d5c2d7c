"""`/files`: upload, list, retrieve, download, delete and validate training files.

The same routes serve the OpenAI-compatible `/v1/files` (api/routes/openai.py mounts them there).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Request, Response, UploadFile
from fastapi.responses import FileResponse

from eft.api.deps import CurrentPrincipal, CurrentTenant, IdempotencyDep, IdempotencyKey, JobServiceDep
from eft.types.files import DatasetReport, FileDeleted, FileList, FileObject, ValidateRequest
from eft.service.files.store import FileRecord, FileStore

router = APIRouter(prefix="/files", tags=["files"])


async def get_file_store(request: Request) -> FileStore:
    return request.app.state.files


FilesDep = Annotated[FileStore, Depends(get_file_store)]


def to_wire(record: FileRecord) -> FileObject:
    return FileObject(id=record.id, bytes=record.bytes, created_at=int(record.created_at.timestamp()),
                      filename=record.filename, purpose=record.purpose, sha256=record.sha256)


def _upload_digest(upload: UploadFile, purpose: str) -> str:
    sha = hashlib.sha256(f"{purpose}\0{upload.filename}\0".encode())
    while chunk := upload.file.read(1024 * 1024):
        sha.update(chunk)
    upload.file.seek(0)
    return sha.hexdigest()


@router.post("", status_code=201, response_model=FileObject,
             responses={200: {"model": FileObject, "description": "The first result of a repeated Idempotency-Key"}})
def upload_file(
    files: FilesDep,
    principal: CurrentPrincipal,
    idempotency: IdempotencyDep,
    response: Response,
    file: Annotated[UploadFile, File(description="A JSONL dataset.")],
    purpose: Annotated[str, Form(max_length=32)] = "fine-tune",
    idempotency_key: IdempotencyKey = None,
) -> FileObject:
    """Upload a JSONL file (multipart `file`, `purpose=fine-tune`); 413 past the upload limit.
    Name it in a job as `training_file: "file-..."`."""
    digest = _upload_digest(file, purpose) if idempotency_key else ""
    file_id, created = idempotency.run(
        principal.tenant, idempotency_key, "POST /files", digest,
        lambda: files.save(principal.tenant, file.filename, purpose, file.file).id,
    )
    if not created:
        response.status_code = 200
    return to_wire(files.get(file_id, principal.tenant))


@router.get("", response_model=FileList)
def list_files(
    files: FilesDep,
    tenant: CurrentTenant,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
    purpose: Annotated[str | None, Query(max_length=32)] = None,
) -> FileList:
    """Files newest first; pass `next_cursor` (the last id) as `after` for the next page."""
    records, has_more = files.list(tenant, min(limit, 100), after, purpose)
    data = [to_wire(r) for r in records]
    return FileList(data=data, has_more=has_more, first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None,
                    next_cursor=data[-1].id if has_more else None)


@router.get("/{file_id}", response_model=FileObject)
def get_file(file_id: str, tenant: CurrentTenant, service: JobServiceDep) -> FileObject:
    """The file's record; a succeeded job's result file (`result_files` on /v1) too."""
    return to_wire(service.file(file_id, tenant))


@router.get("/{file_id}/content", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
def get_file_content(file_id: str, tenant: CurrentTenant, service: JobServiceDep) -> FileResponse:
    """The file's bytes as uploaded (a result file: the job's step metrics as CSV)."""
    record = service.file(file_id, tenant)
    return FileResponse(record.path, media_type="application/octet-stream", filename=record.filename)


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, files: FilesDep, tenant: CurrentTenant) -> FileDeleted:
    """Delete the file; jobs that already read it keep their copy of the data in checkpoints."""
    return FileDeleted(id=files.delete(file_id, tenant).id)


@router.post("/{file_id}/validate", response_model=DatasetReport)
def validate_file(file_id: str, tenant: CurrentTenant, service: JobServiceDep,
                  body: ValidateRequest | None = None) -> DatasetReport:
    """Check every line of the file without creating a job: errors by line and field, warnings
    (duplicates, overlap with `validation_file`), and with `model` the token counts at
    `max_seq_len` and which tokens of the first record carry the loss."""
    return service.validate_file(file_id, tenant, body or ValidateRequest())
