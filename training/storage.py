"""Where checkpoints, artifacts and uploaded files live: a local directory or an object-store URI.

A location is a plain path (`/var/lib/eft/checkpoints`) or any URI `pyarrow.fs` understands
(`s3://bucket/prefix`, `gs://bucket/prefix`, `abfs://container@account.dfs.core.windows.net/p`).
Endpoints, regions and credentials come from the standard environment of each cloud SDK
(`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `GOOGLE_APPLICATION_CREDENTIALS`,
`AZURE_STORAGE_ACCOUNT_KEY`, ...) or from the node's identity (instance role, workload
identity); they are never part of a URI, a job record or a log line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

# The storage variables a job's driver and workers need to reach the same object store as the
# service. They travel in the driver's environment only, never in the job store.
STORAGE_ENV_VARS = (
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    "AWS_EC2_METADATA_DISABLED", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
    "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING",
)


def is_remote(location: str) -> bool:
    """Whether `location` names an object store rather than a local directory."""
    return "://" in location and not location.startswith("file://")


def storage_environment() -> dict[str, str]:
    """The storage variables set in this process, to hand on to a job's processes."""
    return {name: os.environ[name] for name in STORAGE_ENV_VARS if os.environ.get(name)}


def _s3_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    # pyarrow's from_uri asks the bucket for its region, which an S3-compatible endpoint may
    # not answer; with an explicit endpoint the region comes from the environment instead.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    path = uri.split("://", 1)[1].rstrip("/")
    if not endpoint:
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    scheme, _, host = endpoint.rpartition("://")
    fs = pafs.S3FileSystem(
        endpoint_override=host or endpoint, scheme=scheme or "https",
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    )
    return fs, path


@dataclass(frozen=True)
class Location:
    """A root in some filesystem: its URI (as users and job records see it), the pyarrow
    filesystem and the path inside that filesystem."""

    uri: str
    filesystem: pafs.FileSystem
    path: str

    @property
    def remote(self) -> bool:
        return is_remote(self.uri)

    def child(self, *parts: str) -> Location:
        tail = "/".join(p.strip("/") for p in parts)
        return Location(f"{self.uri.rstrip('/')}/{tail}", self.filesystem, f"{self.path.rstrip('/')}/{tail}")

    def uri_of(self, path: str) -> str:
        """The URI of `path`, a path inside this location's filesystem."""
        if not self.remote:
            return path
        if not path.startswith(self.path):
            raise ValueError(f"{path} is not under {self.path}")
        return self.uri.rstrip("/") + path[len(self.path.rstrip("/")):]


def resolve(location: str | Path) -> Location:
    """The `Location` for a path or URI. Raises ValueError naming an unsupported scheme."""
    text = str(location)
    if not is_remote(text):
        local = Path(text.removeprefix("file://")).expanduser().resolve()
        return Location(str(local), pafs.LocalFileSystem(), str(local))
    if text.startswith("s3://"):
        fs, path = _s3_filesystem(text)
        return Location(text.rstrip("/"), fs, path)
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (pafs.ArrowInvalid, ValueError) as exc:  # type: ignore[attr-defined]
        raise ValueError(f"unsupported storage location {text!r}: {exc}") from exc
    return Location(text.rstrip("/"), fs, path.rstrip("/"))


def read_text(fs: pafs.FileSystem, path: str) -> str | None:
    """The text of a file, or None if there is none."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as fh:
        return fh.read().decode()


def write_text(fs: pafs.FileSystem, path: str, text: str) -> None:
    with fs.open_output_stream(path) as fh:
        fh.write(text.encode())


def size_bytes(fs: pafs.FileSystem, path: str) -> int:
    """Bytes in all files under `path` (0 if it is missing)."""
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def exists(location: str) -> bool:
    """Whether a file or directory is at `location` (a path or URI); False if unreachable."""
    try:
        place = resolve(location)
        return place.filesystem.get_file_info(place.path).type != pafs.FileType.NotFound
    except (OSError, ValueError):
        return False
