"""Names a tenant gives for models and data, resolved to what they may name: a path inside the
roots the operator allows (symlinks and `..` resolved first), or a Hub repository id."""

from __future__ import annotations

import re
from pathlib import Path

#: A Hugging Face Hub repository id (`org/name`).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_under_roots(value: str, roots: list[Path]) -> Path | None:
    """The resolved path for `value` (absolute, or relative to a root) if it lies inside one
    of `roots` and exists; symlinks and `..` are resolved before the containment check."""
    try:
        raw = Path(value).expanduser()
        candidates = [raw.resolve()] if raw.is_absolute() else [(r / raw).resolve() for r in roots]
        for candidate in candidates:
            if candidate.exists() and any(_under(candidate, r) for r in roots):
                return candidate
    except (OSError, ValueError, RuntimeError):
        # A name too long for the file system, a NUL byte, or a symlink loop names no file.
        return None
    return None
