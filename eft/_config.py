"""The user's client configuration: `$EFT_CONFIG`, else `$EFT_HOME/config.json`, else
`~/.eft/config.json`, a JSON object with `base_url` and `api_key`. `eft up` writes it, so the
CLI, `eft.Client()` and scripts reach the local service with its key and no setup.
Explicit arguments win over `EFT_BASE_URL` / `EFT_API_KEY`, which win over this file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def config_path() -> Path:
    if os.environ.get("EFT_CONFIG"):
        return Path(os.environ["EFT_CONFIG"]).expanduser()
    home = Path(os.environ["EFT_HOME"]).expanduser() if os.environ.get("EFT_HOME") else Path.home() / ".eft"
    return home / "config.json"


def read_config() -> dict[str, Any]:
    """The saved configuration, or {} when there is none or it is not a JSON object."""
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_config(**values: Any) -> Path:
    """Merge `values` into the configuration file (created private to the user); returns its path."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**read_config(), **values}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
    return path


def model_roots() -> list[Path]:
    """Directories a model name is looked up in, as the service does: `EFT_MODEL_ROOTS` (a JSON
    list), `$EFT_HOME/models` and, in a checkout of the repository, its bundled assets/models."""
    roots = [Path(p) for p in _json_list(os.environ.get("EFT_MODEL_ROOTS"))]
    home = Path(os.environ["EFT_HOME"]) if os.environ.get("EFT_HOME") else Path.home() / ".eft"
    roots += [home / "models", Path(__file__).resolve().parents[1] / "assets" / "models"]
    return [r.expanduser() for r in roots]


def _json_list(text: str | None) -> list[str]:
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
