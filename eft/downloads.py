"""`client.jobs.download`: a job's artifact (or one of its checkpoints) onto local disk, file by
file, streamed through the service from wherever it is stored. Each file is written beside its
destination, checked against the size and SHA-256 the service lists, then renamed into place:
a cut or corrupted download never leaves a file that looks complete."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote


from eft._errors import DownloadError
from eft.types.jobs import ArtifactFile, ArtifactFileList

if TYPE_CHECKING:
    from eft._resource import AsyncAPIResource, SyncAPIResource


def _target(dest: Path, entry: ArtifactFile) -> Path:
    parts = PurePosixPath(entry.path).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or PurePosixPath(entry.path).is_absolute():
        raise DownloadError(f"refusing to write {entry.path!r} outside {dest}")
    return dest.joinpath(*parts)


def _params(checkpoint: int | None, export: str | None = None) -> dict[str, int | str]:
    params: dict[str, int | str] = {} if checkpoint is None else {"checkpoint": checkpoint}
    if export is not None:
        params["export"] = export
    return params


def _file_path(job_id: str, entry: ArtifactFile) -> str:
    return f"/jobs/{job_id}/artifacts/{quote(entry.path)}"


class _Sink:
    """One file being written: bytes to a temporary name, checked, then renamed."""

    def __init__(self, dest: Path, entry: ArtifactFile):
        self.entry, self.target = entry, _target(dest, entry)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.partial = self.target.with_name(self.target.name + ".part")
        self.fh = open(self.partial, "wb")  # noqa: SIM115 - closed in finish/abort
        self.digest, self.size = hashlib.sha256(), 0

    def write(self, chunk: bytes) -> None:
        self.fh.write(chunk)
        self.digest.update(chunk)
        self.size += len(chunk)

    def finish(self) -> Path:
        self.fh.close()
        if self.size != self.entry.bytes or self.digest.hexdigest() != self.entry.sha256:
            self.partial.unlink(missing_ok=True)
            raise DownloadError(f"{self.entry.path}: got {self.size} bytes, sha256 {self.digest.hexdigest()}; "
                                f"the service listed {self.entry.bytes} bytes, sha256 {self.entry.sha256}")
        os.replace(self.partial, self.target)
        return self.target

    def abort(self) -> None:
        self.fh.close()
        self.partial.unlink(missing_ok=True)


def download(jobs: SyncAPIResource, job_id: str, dest: str | os.PathLike, checkpoint: int | None = None,
             export: str | None = None) -> list[Path]:
    """Every file the service lists for the job (`jobs` is `client.jobs`), one after the other."""
    dest = Path(dest)
    params = _params(checkpoint, export)
    listing = jobs._request("GET", f"/jobs/{job_id}/artifacts", cast=ArtifactFileList, params=params)
    return [jobs._download(_file_path(job_id, entry), params, lambda entry=entry: _Sink(dest, entry))
            for entry in listing.data]


async def download_async(jobs: AsyncAPIResource, job_id: str, dest: str | os.PathLike,
                         checkpoint: int | None = None, export: str | None = None) -> list[Path]:
    dest = Path(dest)
    params = _params(checkpoint, export)
    listing = await jobs._request("GET", f"/jobs/{job_id}/artifacts", cast=ArtifactFileList, params=params)
    return [await jobs._download(_file_path(job_id, entry), params, lambda entry=entry: _Sink(dest, entry))
            for entry in listing.data]
