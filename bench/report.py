"""BENCHMARKS.md, written one section at a time: each benchmark owns the section under its
level-2 heading and leaves every other section as it was."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, heading: str, section: str) -> None:
    """Put `section` (starting with the line `heading`) into `path`, replacing the old one in
    place (up to the next level-2 heading) or appending it; written atomically."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    new = section.rstrip("\n").splitlines()
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += [""] + new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = lines[end:]
        lines = lines[:start] + new + ([""] + tail if tail else [])
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
