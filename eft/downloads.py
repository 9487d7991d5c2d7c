"""`client.jobs.download`: a job's artifact (or one of its checkpoints) onto local disk, file by
file, streamed through the service from wherever it is stored. Each file is written beside its
destination, checked against the size and SHA-256 the service lists, then renamed into place:
a cut or corrupted download never leaves a file that looks complete."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import quote

import httpx

from eft._errors import DownloadError
from eft.types.jobs import ArtifactFile, ArtifactFileList

if TYPE_CHECKING:
    from eft.client import AsyncClient, Client


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


def _file_requests(client: Client | AsyncClient, job_id: str, listing: ArtifactFileList,
                   checkpoint: int | None, export: str | None = None) -> Iterator[tuple[ArtifactFile, dict[str, Any]]]:
    """Each listed file with the keyword arguments of the streamed GET that fetches it."""
    for entry in listing.data:
        kwargs = client._request_kwargs("GET", f"/jobs/{job_id}/artifacts/{quote(entry.path)}", None,
                                        _params(checkpoint, export), None)
        kwargs["headers"]["Accept"] = "application/octet-stream"
        del kwargs["json"]
        yield entry, kwargs


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


def download(client: Client, job_id: str, dest: str | os.PathLike, checkpoint: int | None = None,
             export: str | None = None) -> list[Path]:
    dest = Path(dest)
    listing = client._request("GET", f"/jobs/{job_id}/artifacts", cast=ArtifactFileList,
                              params=_params(checkpoint, export))
    written = []
    for entry, kwargs in _file_requests(client, job_id, listing, checkpoint, export):
        for retry in range(client.max_retries + 1):
            sink = _Sink(dest, entry)
            try:
                with client._http.stream(**kwargs) as response:
                    if not response.is_success:
                        response.read()
                        raise client._error(response)
                    for chunk in response.iter_bytes():
                        sink.write(chunk)
                written.append(sink.finish())
                break
            except httpx.TransportError as exc:
                sink.abort()
                if retry >= client.max_retries:
                    raise client._transport_error(exc, kwargs["url"]) from exc
                client._sleep(client._backoff_s(retry))
            except BaseException:
                sink.abort()
                raise
    return written


async def download_async(client: AsyncClient, job_id: str, dest: str | os.PathLike,
                         checkpoint: int | None = None, export: str | None = None) -> list[Path]:
    dest = Path(dest)
    listing = await client._request("GET", f"/jobs/{job_id}/artifacts", cast=ArtifactFileList,
                                    params=_params(checkpoint, export))
    written = []
    for entry, kwargs in _file_requests(client, job_id, listing, checkpoint, export):
        for retry in range(client.max_retries + 1):
            sink = _Sink(dest, entry)
            try:
                async with client._http.stream(**kwargs) as response:
                    if not response.is_success:
                        await response.aread()
                        raise client._error(response)
                    async for chunk in response.aiter_bytes():
                        sink.write(chunk)
                written.append(sink.finish())
                break
            except httpx.TransportError as exc:
                sink.abort()
                if retry >= client.max_retries:
                    raise client._transport_error(exc, kwargs["url"]) from exc
                await client._sleep(client._backoff_s(retry))
            except BaseException:
                sink.abort()
                raise
    return written
