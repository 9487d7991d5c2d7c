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


def _package(reference: str) -> str:
    """The package a `file:function` reference lives in: eft (the client), api, service, training."""
    return reference.split("/", 1)[0]


def test_the_path_of_one_job_crosses_packages_at_most_six_times():
    doc = (REPO / "docs" / "architecture.md").read_text()
    section = doc.split("## The path of one job", 1)[1].split("\n## ", 1)[0]
    hops = re.findall(r"^\d+\. (.*)$", section, re.M)
    assert len(hops) >= 15
    # A hop's place is the first function it names; each function is a hop only once.
    places = [REFERENCE.search(hop) for hop in hops]
    assert all(places), [hop for hop, place in zip(hops, places) if not place]
    names = [f"{m.group(1)}:{m.group(2)}" for m in places]
    assert len(names) == len(set(names)), names
    packages = [_package(m.group(1)) for m in places]
    crossings = sum(a != b for a, b in zip(packages, packages[1:]))
    assert packages[0] == "eft" and crossings <= 6, packages
