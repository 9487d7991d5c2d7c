"""`client.files`: upload, list, retrieve, validate, download and delete training files."""

from __future__ import annotations

import os
import uuid
from typing import Any

from eft._resource import AsyncAPIResource, SyncAPIResource
from eft.types.files import DatasetReport, FileDeleted, FileList, FileObject, ValidateRequest


def _upload_fields(file: str | os.PathLike | bytes, filename: str | None, purpose: str) -> dict:
    """Multipart fields of an upload; the bytes are read once so retries resend the same file."""
    if isinstance(file, bytes):
        content, name = file, filename or "data.jsonl"
    else:
        with open(file, "rb") as fh:
            content = fh.read()
        name = filename or os.path.basename(os.fspath(file))
    return {"files": {"file": (name, content, "application/octet-stream")}, "data": {"purpose": purpose}}


class Files(SyncAPIResource):
    """`client.files`: upload, list, retrieve, validate and delete training files."""

    def create(self, file: str | os.PathLike | bytes, filename: str | None = None,
               purpose: str = "fine-tune") -> FileObject:
        """Upload a JSONL file (POST /files, one Idempotency-Key across retries); returns it."""
        return self._request("POST", "/files", cast=FileObject, idempotency_key=str(uuid.uuid4()),
                                     **_upload_fields(file, filename, purpose))

    def list(self, limit: int = 20, after: str | None = None) -> FileList:
        """Return one page of files, newest first; pass `next_cursor` as `after` for the next."""
        return self._request("GET", "/files", cast=FileList, params={"limit": limit, "after": after})

    def retrieve(self, file_id: str) -> FileObject:
        return self._request("GET", f"/files/{file_id}", cast=FileObject)

    def validate(self, file_id: str, **options: Any) -> DatasetReport:
        """Check every line without creating a job; `model`, `max_seq_len`, `validation_file`."""
        return self._request("POST", f"/files/{file_id}/validate", cast=DatasetReport,
                                     json=ValidateRequest.model_validate(options).model_dump(exclude_unset=True))

    def delete(self, file_id: str) -> FileDeleted:
        return self._request("DELETE", f"/files/{file_id}", cast=FileDeleted)

    def content(self, file_id: str) -> bytes:
        """Return the file's bytes (GET /files/{id}/content)."""
        return self._request_bytes("GET", f"/files/{file_id}/content")


class AsyncFiles(AsyncAPIResource):
    """`async_client.files`: the coroutine twin of `Files`."""

    async def create(self, file: str | os.PathLike | bytes, filename: str | None = None,
                     purpose: str = "fine-tune") -> FileObject:
        return await self._request("POST", "/files", cast=FileObject,
                                           idempotency_key=str(uuid.uuid4()),
                                           **_upload_fields(file, filename, purpose))

    async def list(self, limit: int = 20, after: str | None = None) -> FileList:
        return await self._request("GET", "/files", cast=FileList,
                                           params={"limit": limit, "after": after})

    async def retrieve(self, file_id: str) -> FileObject:
        return await self._request("GET", f"/files/{file_id}", cast=FileObject)

    async def validate(self, file_id: str, **options: Any) -> DatasetReport:
        return await self._request(
            "POST", f"/files/{file_id}/validate", cast=DatasetReport,
            json=ValidateRequest.model_validate(options).model_dump(exclude_unset=True))

    async def delete(self, file_id: str) -> FileDeleted:
        return await self._request("DELETE", f"/files/{file_id}", cast=FileDeleted)

    async def content(self, file_id: str) -> bytes:
        return await self._request_bytes("GET", f"/files/{file_id}/content")
