"""Imports between the packages point one way (docs/architecture.md, "Layers"):

    api -> service -> training          api, service -> eft.types, eft.planner
    the client (eft) imports only itself; training imports nothing first-party

Every import counts: module-level, inside functions, `importlib.import_module("...")`,
`__import__("...")`, and string literals that name a module (`"eft.api.deployment:app"`,
`python -m eft.service.runs.entrypoint`).

No two first-party modules import each other, directly or around a loop, at module level or
inside a function (an import inside a function is still an import: it only hides the loop).
Imports under `if TYPE_CHECKING:` never run and name types only: they are not counted.

Run: .venv/bin/python -m pytest tests/unit/test_layers.py -q
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from tests.helpers.paths import REPO

#: Repository folder -> the package it installs as.
FOLDERS = {"api": "eft.api", "service": "eft.service", "training": "eft.training", "eft": "eft"}
#: Layer -> the layers it may import.
ALLOWED = {
    "api": {"api", "service", "training", "types", "planner", "client"},
    "service": {"service", "training", "types", "planner"},
    "training": {"training"},
    "client": {"client", "types", "planner"},
    "types": {"types"},
    "planner": {"planner"},
}
MODULE_NAME = re.compile(r"(?:^|\s|-m\s+)(eft(?:\.\w+)+)(?::\w+)?(?=\s|$)")


def layer_of(module: str) -> str | None:
    """The layer of a first-party module name, None for anything else."""
    parts = module.split(".")
    if parts[0] != "eft":
        return None
    second = parts[1] if len(parts) > 1 else ""
    return {"api": "api", "service": "service", "training": "training",
            "types": "types", "planner": "planner"}.get(second, "client")


def module_of(path: Path, root: Path) -> str:
    relative = path.relative_to(root).with_suffix("")
    folder, *rest = relative.parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return skipped


def imported_names(path: Path, module: str, executed_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every module `path` imports or names, however it does it; with
    `executed_only`, only the imports that run (no `TYPE_CHECKING` block, no module named in a
    string)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped = _type_checking_only(tree) if executed_only else set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
            # `from eft import service` imports the subpackage eft.service.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if executed_only or layer_of(f"{base}.{alias.name}") not in (None, layer_of(base))]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not executed_only:
            # Only names of the server's packages: "eft.<anything>" is also a logger name.
            found += [(node.lineno, m) for m in MODULE_NAME.findall(node.value)
                      if layer_of(m) not in (None, "client")]
    return found


def violations(root: Path) -> list[str]:
    """Every import in the packages under `root` that points against the layers."""
    wrong: set[str] = set()
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            module = module_of(path, root)
            source = layer_of(module)
            for line, target in imported_names(path, module):
                target_layer = layer_of(target)
                if target_layer is not None and target_layer not in ALLOWED[source]:
                    wrong.add(f"{path.relative_to(root)}:{line}: {source} imports {target}")
    return sorted(wrong)


def import_cycles(root: Path) -> list[list[str]]:
    """Every set of first-party modules that import one another around a loop (the strongly
    connected components of the import graph with more than one module), sorted."""
    paths = {module_of(path, root): path for folder in FOLDERS for path in sorted((root / folder).rglob("*.py"))}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        for _, target in imported_names(path, module, executed_only=True):
            while target and target not in paths:  # `from eft.x import name`: the module eft.x
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    # Tarjan's algorithm, iterative.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return sorted(cycles)


def test_no_two_modules_import_each_other():
    assert import_cycles(REPO) == []


def test_an_import_cycle_is_caught(tmp_path):
    """The check itself can fail: a loop hidden in a function, a longer loop, and a type-only
    import (which runs never, and so is no loop)."""
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "training" / "data.py").write_text("from eft.training.formats import check\n")
    (tmp_path / "training" / "formats.py").write_text("def check():\n    from eft.training.data import x\n")
    (tmp_path / "service" / "a.py").write_text("from eft.service import b\n")
    (tmp_path / "service" / "b.py").write_text("import eft.service.c\n")
    (tmp_path / "service" / "c.py").write_text("from .a import thing\n")
    (tmp_path / "eft" / "client.py").write_text("from eft.jobs import Jobs\n")
    (tmp_path / "eft" / "jobs.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eft.client import Client\n")
    assert import_cycles(tmp_path) == [
        ["eft.service.a", "eft.service.b", "eft.service.c"],
        ["eft.training.data", "eft.training.formats"],
    ]


def test_every_import_points_down_the_layers():
    assert violations(REPO) == []


def test_an_import_against_the_layers_is_caught(tmp_path):
    """The check itself can fail: one wrong arrow of each kind in a copy of the layout."""
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "training" / "driver.py").write_text(
        "def run():\n    from eft.service.store.store import Store\n")
    (tmp_path / "service" / "jobs.py").write_text("from eft.api.app import create_app\n")
    (tmp_path / "eft" / "cli.py").write_text(
        "import importlib\nlocal = importlib.import_module('eft.api.local')\n")
    (tmp_path / "training" / "loop.py").write_text("from eft.types import JobStatus\n")
    (tmp_path / "service" / "launcher.py").write_text(
        "ENTRY = 'python -m eft.api.deployment'\nfrom . import store\n")
    assert violations(tmp_path) == [
        "eft/cli.py:2: client imports eft.api.local",
        "service/jobs.py:1: service imports eft.api.app",
        "service/launcher.py:1: service imports eft.api.deployment",
        "training/driver.py:2: training imports eft.service.store.store",
        "training/loop.py:1: training imports eft.types",
    ]


def unshipped_packages(root: Path) -> list[str]:
    """Packages under the folders pyproject.toml maps into `eft` (a directory with an
    `__init__.py`) that its `packages` list leaves out of the wheel: the editable install finds
    them by path, an installed product would not have them."""
    import tomllib

    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for name, folder in tool["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                relative = init.parent.relative_to(root / folder).parts
                found.add(".".join((name, *relative)))
    return sorted(found - listed)


def test_every_package_ships_in_the_wheel():
    assert unshipped_packages(REPO) == []


def test_a_package_left_out_of_the_wheel_is_caught(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "eft" = "eft", "eft.training" = "training" }\n'
        'packages = ["eft", "eft.training"]\n')
    for folder in ("eft", "training", "training/objectives", "training/objectives/__pycache__"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    assert unshipped_packages(tmp_path) == ["eft.training.objectives"]


#: Folders inside a package, and the modules of the same package they must not import: a rule
#: lives in the folder its concept names, and a stage does not reach back into what runs it.
FOLDER_RULES = {
    # The store is the floor: a status change knows its lifecycle and the webhooks it owes, nothing more.
    "service/store": ("eft.service.accounts", "eft.service.files", "eft.service.requests", "eft.service.jobs.manager",
                      "eft.service.jobs.wire", "eft.service.jobs.openai", "eft.service.scheduling", "eft.service.runs",
                      "eft.service.serving"),
    "service/accounts": ("eft.service.files", "eft.service.requests", "eft.service.jobs", "eft.service.runs",
                         "eft.service.serving", "eft.service.webhooks"),
    "service/files": ("eft.service.requests", "eft.service.jobs", "eft.service.scheduling", "eft.service.runs",
                      "eft.service.serving", "eft.service.webhooks"),
    # A request's stages check and plan; they never reach back into what runs them.
    "service/requests": ("eft.service.jobs", "eft.service.scheduling", "eft.service.runs", "eft.service.serving",
                         "eft.service.webhooks"),
    "service/scheduling": ("eft.service.accounts", "eft.service.files", "eft.service.requests",
                           "eft.service.jobs.manager", "eft.service.serving", "eft.service.webhooks"),
    "service/runs": ("eft.service.requests", "eft.service.jobs", "eft.service.scheduling", "eft.service.serving",
                     "eft.service.webhooks"),
    "service/serving": ("eft.service.accounts", "eft.service.files", "eft.service.requests", "eft.service.jobs",
                        "eft.service.scheduling", "eft.service.runs", "eft.service.webhooks"),
    "service/webhooks": ("eft.service.accounts", "eft.service.files", "eft.service.requests", "eft.service.jobs",
                         "eft.service.scheduling", "eft.service.runs", "eft.service.serving"),
}


def folder_rule_breaches(root: Path) -> list[str]:
    """"<file>:<line>: imports <module>" for every import a folder's rule forbids."""
    breaches = []
    for folder, forbidden in FOLDER_RULES.items():
        for path in sorted((root / folder).rglob("*.py")):
            for line, name in imported_names(path, module_of(path, root), executed_only=True):
                for f in forbidden:
                    breach = f"{path.relative_to(root)}:{line}: imports {f}"
                    if (name == f or name.startswith(f + ".")) and breach not in breaches:
                        breaches.append(breach)
    return breaches


def test_each_folder_keeps_to_its_concept():
    assert folder_rule_breaches(REPO) == []


def test_a_folder_reaching_into_what_runs_it_is_caught(tmp_path):
    (tmp_path / "service" / "requests").mkdir(parents=True)
    (tmp_path / "service" / "requests" / "check.py").write_text("from eft.service.scheduling.scheduler import Scheduler\n")
    assert folder_rule_breaches(tmp_path) == ["service/requests/check.py:1: imports eft.service.scheduling"]


#: What a route must not reach through the service for: the rooms' own state. A route calls one
#: method of the job service (or of one of its facades: `exports`, `models`, `webhooks`, `logs`).
REACH_THROUGH = ("store", "engine", "launcher", "settings")


def reach_throughs(root: Path) -> list[str]:
    """"<file>:<line>: .<attribute>" for every route reading a service's state."""
    found = []
    for path in sorted((root / "api" / "routes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in REACH_THROUGH:
                found.append(f"{path.relative_to(root)}:{node.lineno}: .{node.attr}")
    return sorted(found)


def test_routes_call_the_service_and_never_reach_into_it():
    assert reach_throughs(REPO) == []


def test_a_route_reaching_into_the_store_is_caught(tmp_path):
    (tmp_path / "api" / "routes").mkdir(parents=True)
    (tmp_path / "api" / "routes" / "jobs.py").write_text(
        "def get(service):\n    job = service.get('x')\n    return service.store.get_job('x')\n")
    assert reach_throughs(tmp_path) == ["api/routes/jobs.py:3: .store"]


#: The most lines a product module holds: past it, a module is doing two jobs. Data tables
#: (registries of known models and their numbers) are exempt, by name.
MAX_LINES = 450
DATA_TABLES: set[str] = set()


def oversized(root: Path) -> list[str]:
    """"<file>: <lines>" for every product module over MAX_LINES."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            name = str(path.relative_to(root))
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES and name not in DATA_TABLES:
                found.append(f"{name}: {lines}")
    return found


def test_no_product_module_is_over_450_lines():
    assert oversized(REPO) == []


def test_an_oversized_module_is_caught(tmp_path):
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "service" / "small.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == [f"service/big.py: {MAX_LINES + 1}"]
