"""Credentials stay out of Ray: no password or key travels in a Ray Job's or the Serve app's
runtime environment, entrypoint or metadata, because Ray's dashboard API hands those to anyone
who can reach it.

A process of the service gets its credentials from its node's own environment (a Kubernetes
Secret as `envFrom` on every pod, the cluster launcher's env file) or from a secrets file: a
dotenv file (`KEY="value"` lines, mode 0600) whose *path* is `EFT_SECRETS_FILE`. The path is
all that travels: the service replica, each job's driver and, through Ray's
`worker_process_setup_hook`, every worker process of the job (the Train controller and
workers, which reach the checkpoint store) read the file on their own node. Values already in a
process's environment win over the file's.

`eft up` and `deploy_app` write the file under `EFT_HOME` from the secrets they are given; on a
cluster, mount a Kubernetes Secret at the same path on every pod (docs/operations.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

#: The variable naming the secrets file; its value is a path, never a secret.
FILE_VAR = "EFT_SECRETS_FILE"
#: Ray runs this in every worker process of a job before any task (runtime_env).
SETUP_HOOK = "eft.service.credentials.load"
#: Variables that are credentials. The database URL counts as one whether or not it holds a
#: password (a URL without one may still name a host and user the world should not see).
SECRET_VARS = frozenset({
    "EFT_DATABASE_URL", "EFT_ADMIN_API_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING",
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "RAY_AUTH_TOKEN",
})


def split(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the variables that may travel in a runtime environment, the secret ones)."""
    public = {k: v for k, v in env.items() if k not in SECRET_VARS}
    secret = {k: v for k, v in env.items() if k in SECRET_VARS}
    return public, secret


def _quote(value: str) -> str:
    # python-dotenv reads a double-quoted value with backslash escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def write(path: Path, values: Mapping[str, str]) -> Path:
    """Write `values` as the secrets file at `path`, readable by its owner only (created 0600,
    then renamed into place, so no reader sees half a file or a wider mode). Returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("".join(f"{key}={_quote(value)}\n" for key, value in sorted(values.items())))
    os.replace(staging, path)
    return path


#: What `on_load` registered.
_AFTER_LOAD: list[Callable[[], Any]] = []


def read(path: Path) -> dict[str, str]:
    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def load(path: str | Path | None = None) -> list[str]:
    """Put the secrets file's values into this process's environment, under any already set.
    `path` defaults to `EFT_SECRETS_FILE`; no path, or no file there, loads nothing. Returns
    the names loaded. Run first thing by every process of the service (Ray calls it in the
    job's worker processes as their setup hook)."""
    where = path or os.environ.get(FILE_VAR)
    if not where or not Path(where).is_file():
        return []
    loaded = []
    for key, value in read(Path(where)).items():
        if key not in os.environ:
            os.environ[key] = value
            loaded.append(key)
    if loaded:
        for callback in _AFTER_LOAD:
            callback()  # e.g. settings read before the file was loaded are stale
    return loaded


def on_load(callback: Callable[[], Any]) -> None:
    """Call `callback` whenever `load` puts new values into the environment (settings.py clears
    its cached settings so; this module imports none of the service's)."""
    _AFTER_LOAD.append(callback)


def public_env(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment to hand a Serve app: `env` without its secrets, which are written to
    `<home>/secrets.env` (0600) and named by `EFT_SECRETS_FILE` instead."""
    public, secret = split(env)
    if secret:
        public[FILE_VAR] = str(write(Path(public.get(FILE_VAR) or home / "secrets.env"), secret))
    return public


def hub_token() -> str | None:
    """The operator's Hugging Face token, from this process's environment (or the secrets file
    it loaded): never stored by the service, never sent through Ray."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None
