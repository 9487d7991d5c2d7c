"""What a job wrote, made local to read: a published artifact or a checkpoint at any storage the
service writes to (a directory or an object store), copied under a cache directory when it is
not on this machine's disk. The model servers' engine loads adapters through it, exports read
the artifact they merge."""

from __future__ import annotations

import hashlib
import shutil
import threading
from pathlib import Path


def fetch(location: str, local: Path, only: tuple[str, ...] | None) -> tuple[Path, bool]:
    """A local directory holding the files at `location` (all of them, or `only`), and whether
    it is a copy under `local`. A published artifact on this machine's disk is read where it
    is; a checkpoint (`only`) is always copied first, since the job may prune it while it loads.
    Raises FileNotFoundError when the location holds none of the files."""
    import pyarrow.fs as pafs

    from eft.training import storage

    place = storage.resolve(location)
    if only is None and isinstance(place.filesystem, pafs.LocalFileSystem):
        return Path(place.path), False
    target = local / hashlib.sha256(place.uri.encode()).hexdigest()[:24]
    if target.is_dir():
        return target, True
    staging = target.with_name(f"{target.name}.{threading.get_ident()}.part")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if only is None:
            pafs.copy_files(place.path, str(staging), source_filesystem=place.filesystem,
                            destination_filesystem=pafs.LocalFileSystem())
        else:
            for name in only:
                info = place.filesystem.get_file_info(place.child(name).path)
                if info.type != pafs.FileType.File:
                    if name == only[0]:
                        raise FileNotFoundError(f"{location}/{name}")
                    continue  # the caller tells what the missing optional file means
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                pafs.copy_files(info.path, str(staging / name), source_filesystem=place.filesystem,
                                destination_filesystem=pafs.LocalFileSystem())
        if not any(staging.iterdir()):
            raise FileNotFoundError(location)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, True
