"""Every `file:function` that docs/architecture.md names exists."""

import ast
import re
from pathlib import Path
from tests.helpers.paths import REPO

REFERENCE = re.compile(r"`([\w/]+\.py):([\w.]+)`")


def _defined_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(f"{node.name}.{n.name}" for n in node.body
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    return names


def test_every_named_function_exists():
    doc = (REPO / "docs" / "architecture.md").read_text()
    references = REFERENCE.findall(doc)
    assert len(references) >= 15
    missing = [f"{f}:{n}" for f, n in references
               if not (REPO / f).is_file() or n not in _defined_names(REPO / f)]
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def _room(path: str) -> str:
    """The package or sub-package a file lives in: `eft`, `eft/types`, `api`, `api/routes`,
    `service` (its shared modules), `service/jobs`, `training`, `training/strategies`, ..."""
    return path.rsplit("/", 1)[0] if "/" in path else path


def _path(section_title: str) -> tuple[list[str], list[str]]:
    """(the place of each hop: the first `file:function` its line names, in order; every file
    the section names, in order of first mention) of one numbered path in the document."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc.split(f"## {section_title}", 1)[1].split("\n## ", 1)[0]
    hops = re.findall(r"^\d+\. (.*)$", section, re.M)
    places = [REFERENCE.search(hop) for hop in hops]
    assert all(places), [hop for hop, place in zip(hops, places) if not place]
    files = list(dict.fromkeys(re.findall(r"`([\w/]+\.py)(?::[\w.]+)?`", section)))
    return [f"{m.group(1)}:{m.group(2)}" for m in places], files


def _switches(places: list[str]) -> int:
    rooms = [_room(p.split(":", 1)[0]) for p in places]
    return sum(a != b for a, b in zip(rooms, rooms[1:]))


def test_one_jobs_path_opens_at_most_35_files_and_switches_rooms_at_most_12_times():
    """From `POST /jobs` to the adapter, one line per hop, each hop named once: the files a reader
    opens to follow it, and the times it moves to another package or sub-package."""
    places, files = _path("The path of one job")
    assert len(places) >= 15
    assert len(places) == len(set(places)), places
    assert places[0].startswith("eft/") and places[-1].startswith("service/runs/"), places
    rooms = " -> ".join(dict.fromkeys(_room(p.split(":")[0]) for p in places))
    print(f"\none job's path: {len(places)} hops, {len(files)} files, {_switches(places)} switches ({rooms})")
    assert len(files) <= 35, files
    assert _switches(places) <= 12, places


def test_one_chat_reply_opens_at_most_8_files():
    places, files = _path("The path of one chat reply")
    assert places[0] == "api/routes/completions.py:chat_completions"
    assert any(p.startswith("service/serving/") and p.endswith(".generate") for p in places), places
    print(f"\none chat reply's path: {len(places)} hops, {len(files)} files, {_switches(places)} switches")
    assert len(files) <= 8, files
