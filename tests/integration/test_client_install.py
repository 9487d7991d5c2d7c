"""`pip install eft` (no extras) in a fresh virtual environment gives a working client and CLI
with none of the server's dependencies, and puts nothing but `eft` at the top of site-packages.

Run: .venv/bin/python -m pytest tests/integration/test_client_install.py -q
(builds the wheel and installs it with httpx, pydantic, typer and rich from the package index)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from tests.helpers.paths import REPO

HEAVY = ("torch", "ray", "fastapi", "transformers", "sqlalchemy", "deepspeed")


def _run(*args: str | Path, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, check=check)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> tuple[Path, Path]:
    """A fresh venv with the project's wheel installed without extras; returns (venv, wheel)."""
    root = tmp_path_factory.mktemp("client-install")
    # Built from a copy, so that the build leaves nothing in the checkout.
    source = root / "source"
    for name in ("api", "service", "training", "eft"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", root / "dist", source)
    (wheel,) = (root / "dist").glob("eft-*.whl")
    venv.create(root / "venv", with_pip=True)
    python = root / "venv" / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", wheel)
    return root / "venv", wheel


def test_the_wheel_installs_nothing_but_eft_at_the_top(client_venv):
    _, wheel = client_venv
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
        names = archive.namelist()
    assert {t for t in tops if not t.endswith(".dist-info")} == {"eft"}
    # The repository's folders are inside the namespace, with the web page's static files.
    for module in ("eft/api/app.py", "eft/service/store/store.py", "eft/training/loop.py",
                   "eft/types/jobs.py", "eft/planner/planning.py", "eft/api/static/ui.js"):
        assert module in names, module


def test_the_client_and_cli_work_without_the_servers_dependencies(client_venv):
    env, _ = client_venv
    python, cli = env / "bin" / "python", env / "bin" / "eft"
    code = ("import importlib.util, eft\n"
            "assert eft.Client and eft.AsyncClient and eft.JobStatus.succeeded.value == 'succeeded'\n"
            f"print(','.join(m for m in {HEAVY!r} if importlib.util.find_spec(m)))")
    result = _run(python, "-c", code, cwd=env)
    assert result.stdout.strip() == "", f"installed without extras: {result.stdout.strip()}"
    help_text = _run(cli, "--help", cwd=env).stdout
    for command in ("jobs", "files", "plan", "up", "keys"):
        assert command in help_text
    # The planner is pure Python in the client: plans offline, with no server.
    planned = _run(cli, "plan", "--model", "llama-2-7b", "--gpus", "1", "--gpu-memory", "80", "--json", cwd=env)
    assert '"chosen"' in planned.stdout
    # A server command says what to install, with the usage exit code's neighbour: 1.
    up = _run(cli, "up", cwd=env, check=False)
    assert up.returncode == 1 and "eft[server]" in up.stderr
