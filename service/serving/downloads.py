"""What a job wrote, file by file, for download through the API: the published artifact of a
succeeded job, or one of its kept checkpoints, from any storage the service supports (a
directory, an object store). Each file is listed with its size and SHA-256, which the clients
check after the download: an artifact's hashes are those its publish recorded in its commit
marker (no API thread reads its bytes to list it); a checkpoint's are computed once per
version of a file (path, size, mtime)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import PurePosixPath
from typing import Any, Iterator

import pyarrow.fs as pafs

from eft.service.errors import Conflict, ServiceError
from eft.service.store.store import JobRecord
from eft.types.jobs import JobStatus

CHUNK = 1 << 20


class ArtifactNotFound(ServiceError):
    status_code = 404
    code = "artifact_not_found"


def location_of(job: JobRecord, checkpoints: list[dict[str, Any]], step: int | None) -> str:
    """Where the files to download are: the job's artifact (step None), or its checkpoint of
    `step`. Raises Conflict for a job with no artifact yet, ArtifactNotFound for a checkpoint
    never saved or pruned since."""
    if step is None:
        if job.status is not JobStatus.succeeded or not job.artifact_path:
            raise Conflict(f"job {job.id} is {job.status.value}: its artifact is written when it succeeds; "
                           "download one of its checkpoints with ?checkpoint=<step> meanwhile",
                           code="artifact_not_available", param="job_id")
        return job.artifact_path
    for checkpoint in checkpoints:
        if checkpoint["step"] == step and checkpoint["available"]:
            return checkpoint["path"]
    kept = [c["step"] for c in checkpoints if c["available"]]
    raise ArtifactNotFound(f"job {job.id} keeps no checkpoint of step {step} (kept: {kept or 'none'}): "
                           "list them with GET /jobs/{id}/checkpoints", param="checkpoint")


def _entry(place_uri: str, info: pafs.FileInfo, root: str, recorded: dict[str, tuple[int, str]]) -> dict[str, Any]:
    relative = info.path[len(root):]
    size, sha = recorded.get(relative, (None, None))
    if size != info.size or not sha:
        sha = _sha256(place_uri, info.path, info.size, info.mtime_ns)
    return {"path": relative, "bytes": info.size, "sha256": sha}


def _recorded(place: Any) -> dict[str, tuple[int, str]]:
    """{relative path: (size, SHA-256)} as the publish of what is at `place` recorded them in
    its commit marker (none for a checkpoint, or an artifact published before it did)."""
    from eft.training.artifacts import COMMIT_MARKER

    info = place.filesystem.get_file_info(place.child(COMMIT_MARKER).path)
    if info.type != pafs.FileType.File:
        return {}
    return _read_marker(place.uri, info.path, info.size, info.mtime_ns)


@functools.lru_cache(maxsize=1024)
def _read_marker(uri: str, path: str, _size: int, _mtime_ns: int | None) -> dict[str, tuple[int, str]]:
    import json

    from eft.training import storage

    try:
        marker = json.loads(storage.read_text(storage.resolve(uri).filesystem, path) or "{}")
    except ValueError:
        return {}
    sizes, hashes = marker.get("files") or {}, marker.get("sha256") or {}
    return {name: (sizes.get(name), sha) for name, sha in hashes.items() if isinstance(sha, str)}


def list_files(location: str) -> list[dict[str, Any]]:
    """Every file under `location`, by path relative to it, with `bytes` and `sha256`."""
    from eft.training import storage

    place = storage.resolve(location)
    selector = pafs.FileSelector(place.path, recursive=True, allow_not_found=True)
    infos = sorted((i for i in place.filesystem.get_file_info(selector) if i.type == pafs.FileType.File),
                   key=lambda i: i.path)
    root = place.path.rstrip("/") + "/"
    recorded = _recorded(place)
    return [_entry(place.uri, i, root, recorded) for i in infos]


@functools.lru_cache(maxsize=4096)
def _sha256(uri: str, path: str, _size: int, _mtime_ns: int | None) -> str:
    from eft.training import storage

    digest = hashlib.sha256()
    with storage.resolve(uri).filesystem.open_input_stream(path) as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


#: The longest path under an artifact a download may name.
MOST_PATH_CHARS = 1024


def open_file(location: str, relative: str) -> tuple[dict[str, Any], Iterator[bytes]]:
    """One file's entry (as `list_files` gives it) and its bytes in chunks. Raises
    ArtifactNotFound for anything but a file under the location (no `..`, no absolute path)."""
    from eft.training import storage

    parts = PurePosixPath(relative).parts
    place = storage.resolve(location)
    info = None
    # A name no file system holds (a NUL, a name over 255 bytes, a path over 1024) is no file
    # here, asked of no file system (the local one raises on it).
    plausible = ("\x00" not in relative and len(relative) <= MOST_PATH_CHARS
                 and all(len(p.encode()) <= 255 for p in parts))
    if (plausible and parts and not PurePosixPath(relative).is_absolute()
            and not any(p in (".", "..") for p in parts)):
        info = place.filesystem.get_file_info(place.child(relative).path)
    if info is None or info.type != pafs.FileType.File:
        raise ArtifactNotFound(f"no file {relative!r} here: list the files with GET /jobs/{{id}}/artifacts",
                               param="path")
    entry = _entry(place.uri, info, place.path.rstrip("/") + "/", _recorded(place))

    def chunks() -> Iterator[bytes]:
        with place.filesystem.open_input_stream(info.path) as fh:
            while chunk := fh.read(CHUNK):
                yield chunk

    return entry, chunks()
