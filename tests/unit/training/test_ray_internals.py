"""Ray's private modules are imported in one module, training/_ray.py, against the pinned Ray.

Run: .venv/bin/python -m pytest tests/unit/training/test_ray_internals.py -q
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import ray

from eft.training import _ray
from tests.helpers.paths import REPO

PRIVATE = re.compile(r"^ray(\.\w+)*\.(_private|_internal)(\.|$)|^ray\._")


def _private_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return [n for n in names if PRIVATE.match(n)]


def test_only_one_module_imports_rays_internals():
    offenders = {
        str(path.relative_to(REPO)): found
        for folder in ("api", "service", "training", "eft", "tests", "bench", "examples")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != REPO / "training" / "_ray.py" and (found := _private_imports(path))
    }
    assert offenders == {}
    assert _private_imports(REPO / "training" / "_ray.py")  # the check sees them where they are


def test_ray_is_pinned_to_the_release_the_internals_were_tested_with():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [r for r in project["optional-dependencies"]["server"] if r.startswith("ray[")]
    assert pins == [f"ray[train,serve]=={_ray.TESTED_RAY_VERSION}.*"]
    constraints = (REPO / "deploy" / "constraints.txt").read_text()
    assert f"\nray=={ray.__version__}\n" in constraints
    assert _ray.ray_version_tested()
