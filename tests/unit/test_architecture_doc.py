"""Every `file:function` that docs/architecture.md names exists."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
