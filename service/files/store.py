"""Uploaded files: stored under `<files root>/<id>.jsonl` (or `.parquet`, `.csv`, after the
uploaded name), owned by a tenant.

An upload is streamed to a temporary file in the same directory while its SHA-256 and size are
computed, then renamed into place and recorded: a failed or oversized upload leaves nothing
behind. Jobs name an upload by id (`file-...`) in `training_file` / `validation_file`;
`service/requests/resolve.py:resolve_dataset` finds it with `uploaded_path`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

import sqlalchemy as sa

from eft.service.errors import Conflict, ServiceError
from eft.service.store.schema import files as table
from eft.service.store.schema import jobs as jobs_table
from eft.service.settings import Settings
from eft.training.storage import is_remote
from eft.service.accounts.quotas import QuotaExceeded
from eft.service.store.db import serialized, tenant_key
from eft.service.store.store import _aware, utcnow

FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
PURPOSES = ("fine-tune",)
#: What the service writes itself: a succeeded job's step metrics (service/files/results.py).
RESULTS_PURPOSE = "fine-tune-results"
CHUNK_BYTES = 1024 * 1024


class FileNotFound(ServiceError):
    status_code = 404
    code = "file_not_found"

    def __init__(self, file_id: str):
        super().__init__(f"no file with id {file_id!r}: list files with GET /files", param="file_id")


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "payload_too_large"


@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    sha256: str
    path: str
    created_at: datetime


#: How uploads are stored: JSONL, Parquet or CSV (see eft.training.formats).
UPLOAD_SUFFIXES = (".jsonl", ".parquet", ".csv")


def new_file_id() -> str:
    """`file-` + 12 hex digits of milliseconds + 12 random: sorts by creation time."""
    return f"file-{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def files_root(settings: Settings) -> Path:
    """The uploads' directory. Uploads are validated and read as local files, so an object-store
    `EFT_FILES_ROOT` is refused here with the setting named."""
    root = settings.resolved_files_root
    if is_remote(root):
        raise RuntimeError(f"EFT_FILES_ROOT must be a local or shared-filesystem path, not {root!r}: "
                           "uploads are read by the scheduler and the workers as files")
    return Path(root)


def uploaded_path(file_id: str, settings: Settings) -> Path:
    """Where an upload's bytes live (the id is checked against FILE_ID first, so no traversal)."""
    if not FILE_ID.match(file_id):
        raise FileNotFound(file_id)
    root = files_root(settings)
    for suffix in UPLOAD_SUFFIXES:
        if (root / f"{file_id}{suffix}").is_file():
            return root / f"{file_id}{suffix}"
    return root / f"{file_id}.jsonl"


def upload_suffix(filename: str) -> str:
    """The stored file's suffix, from the uploaded name: Parquet and CSV keep theirs, anything
    else is read as JSONL."""
    suffix = Path(filename).suffix.lower()
    return suffix if suffix in UPLOAD_SUFFIXES else ".jsonl"


def check_filename(filename: str | None) -> str:
    """The upload's name as given, refused (400) when it is empty, too long, has control
    characters or is a path: names are labels here, never paths."""
    name = filename or ""
    bad = (not name.strip() or len(name) > 255 or name in (".", "..") or "/" in name or "\\" in name
           or any(unicodedata.category(c).startswith("C") for c in name))
    if bad:
        raise ServiceError("file name must be 1 to 255 printable characters with no '/' or '\\': "
                           "send the file's base name", param="file", code="invalid_filename")
    return name


def _record(row: sa.Row) -> FileRecord:
    return FileRecord(id=row.id, tenant=row.tenant, filename=row.filename, purpose=row.purpose,
                      bytes=row.bytes, sha256=row.sha256, path=row.path,
                      created_at=_aware(row.created_at))


class FileStore:
    """Uploads on disk and their rows in the job store's database."""

    def __init__(self, engine: sa.Engine, settings: Settings):
        self.engine, self.settings = engine, settings

    def save(self, tenant: str, filename: str | None, purpose: str, stream: BinaryIO,
             file_id: str | None = None) -> FileRecord:
        """Stream `stream` into place and record it. Raises ServiceError (400) for a bad name or
        purpose, PayloadTooLarge (413) past `max_upload_bytes`; nothing is kept then. The
        service's own files (`file_id` given) may have the results purpose."""
        name = check_filename(filename)
        if purpose not in PURPOSES and not (file_id and purpose == RESULTS_PURPOSE):
            raise ServiceError(f"purpose must be one of {', '.join(PURPOSES)}, not {purpose!r}",
                               param="purpose", code="invalid_purpose")
        root = files_root(self.settings)
        root.mkdir(parents=True, exist_ok=True)
        own = file_id is not None  # the service's own file: outside the tenant's upload limits
        file_id = file_id or new_file_id()
        with self.engine.connect() as conn:
            count, used = self._usage(conn, tenant)
        if own:
            count, used = 0, 0
        self._check_usage(tenant, count, used, 0)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".upload-")
        try:
            # Streaming stops as soon as the tenant's storage would overflow, not at the end.
            digest, size = self._copy(stream, fd, self.settings.max_file_bytes_per_tenant - used)
            # The service's own files may be written by two processes at once: each its own name.
            suffix = f".{secrets.token_hex(4)}" if own else ""
            final = files_root(self.settings) / f"{file_id}{suffix}{upload_suffix(name)}"
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        try:
            # Checked again with the insert, serialized with the tenant's other writes, so
            # concurrent uploads never pass the limits together.
            with serialized(self.engine, tenant_key(tenant)) as conn:
                if not own:
                    self._check_usage(tenant, *self._usage(conn, tenant), size)
                elif conn.execute(sa.select(table.c.id).where(table.c.id == file_id)).first() is not None:
                    final.unlink(missing_ok=True)  # the other writer's copy is the file
                    return self.get(file_id, tenant, conn)
                conn.execute(table.insert().values(
                    id=file_id, tenant=tenant, filename=name, purpose=purpose, bytes=size,
                    sha256=digest, path=str(final), created_at=utcnow()))
        except BaseException:
            final.unlink(missing_ok=True)
            raise
        return self.get(file_id, tenant)

    @staticmethod
    def _usage(conn: sa.Connection, tenant: str) -> tuple[int, int]:
        """(uploads, bytes) the tenant keeps (its jobs' result files are the service's, not counted)."""
        count, used = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(table.c.bytes), 0))
                                   .where(table.c.tenant == tenant, table.c.purpose != RESULTS_PURPOSE)).one()
        return int(count), int(used)

    def _check_usage(self, tenant: str, count: int, used: int, size: int) -> None:
        limit_files, limit_bytes = self.settings.max_files_per_tenant, self.settings.max_file_bytes_per_tenant
        if count + 1 > limit_files:
            raise QuotaExceeded(f"tenant {tenant!r} keeps {count} uploads, the limit is {limit_files}: "
                                "delete some with DELETE /files/{id}", "file", self.settings.quota_retry_after_s)
        if used + size > limit_bytes:
            raise PayloadTooLarge(f"tenant {tenant!r} keeps {used} bytes of uploads and this file would take it "
                                  f"past its limit of {limit_bytes}: delete some with DELETE /files/{{id}}, or "
                                  "ask the operator to raise EFT_MAX_FILE_BYTES_PER_TENANT", param="file")

    def _copy(self, stream: BinaryIO, fd: int, room: int) -> tuple[str, int]:
        limit, sha, size = self.settings.max_upload_bytes, hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            while chunk := stream.read(CHUNK_BYTES):
                size += len(chunk)
                if size > room:
                    raise PayloadTooLarge(f"the file would take the tenant past its upload storage limit of "
                                          f"{self.settings.max_file_bytes_per_tenant} bytes: delete some "
                                          "uploads with DELETE /files/{id}, or ask the operator to raise "
                                          "EFT_MAX_FILE_BYTES_PER_TENANT", param="file")
                if size > limit:
                    raise PayloadTooLarge(f"the file exceeds the upload limit of {limit} bytes: "
                                          "split it, or ask the operator to raise EFT_MAX_UPLOAD_BYTES",
                                          param="file")
                sha.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        return sha.hexdigest(), size

    def get(self, file_id: str, tenant: str | None, conn: sa.Connection | None = None) -> FileRecord:
        """The file; raises FileNotFound, also for another tenant's file (tenant None: any).
        With `conn`, read in that connection's transaction."""
        query = table.select().where(table.c.id == file_id)
        if tenant is not None:
            query = query.where(table.c.tenant == tenant)
        if conn is None:
            with self.engine.connect() as own:
                row = own.execute(query).first()
        else:
            row = conn.execute(query).first()
        if row is None:
            raise FileNotFound(file_id)
        return _record(row)

    def list(self, tenant: str | None, limit: int = 20, after: str | None = None,
             purpose: str | None = None) -> tuple[list[FileRecord], bool]:
        """Returns (files newest first after the cursor id, has_more)."""
        query = table.select().order_by(table.c.id.desc()).limit(limit + 1)
        if tenant is not None:
            query = query.where(table.c.tenant == tenant)
        if after:
            query = query.where(table.c.id < after)
        if purpose:
            query = query.where(table.c.purpose == purpose)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [_record(r) for r in rows[:limit]], len(rows) > limit

    def delete(self, file_id: str, tenant: str | None) -> FileRecord:
        """Forget the file and remove its bytes; raises FileNotFound, or Conflict (409) naming
        the jobs that have not ended and train or validate on it (their next resume reads it
        again). Serialized with the tenant's creates, so no job can start using it meanwhile."""
        record = self.get(file_id, tenant)
        with serialized(self.engine, tenant_key(record.tenant)) as conn:
            users = self.jobs_using(conn, record)
            if users:
                raise Conflict(f"file {file_id} is used by job(s) {', '.join(users)} that have not ended: "
                               "wait for them to finish or cancel them, then delete it",
                               code="file_in_use", param="file_id")
            conn.execute(table.delete().where(table.c.id == file_id))
        Path(record.path).unlink(missing_ok=True)
        return record

    @staticmethod
    def jobs_using(conn: sa.Connection, record: FileRecord) -> list[str]:
        """Ids of the jobs that have not ended and name the file (an admin's job may name
        another tenant's file)."""
        ended = ("succeeded", "failed", "cancelled")
        rows = conn.execute(sa.select(jobs_table.c.id, jobs_table.c.request).where(
            jobs_table.c.status.not_in(ended))).all()
        return [job_id for job_id, request in rows
                if record.id in ((request or {}).get("training_file"), (request or {}).get("validation_file"))]
