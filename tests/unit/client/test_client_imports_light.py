"""The client installs on a laptop: importing it must not load torch, ray, fastapi or transformers.

Run: .venv/bin/python -m pytest tests/unit/client/test_client_imports_light.py -q
"""

import subprocess
import sys
from tests.helpers.paths import REPO

HEAVY = ("torch", "ray", "fastapi", "transformers")


def test_importing_the_client_loads_nothing_heavy():
    code = (
        "import sys, eft, eft.client, eft.cli.main\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120, cwd=REPO)
    assert result.stdout.strip() == "", f"importing eft loaded {result.stdout.strip()}"
