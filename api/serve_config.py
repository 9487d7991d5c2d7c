"""The Serve config of the service: one source for `eft up`, `deploy/serve.yaml` and the
KubeRay RayService's `serveConfigV2`.

`eft up` (api/local.py:deploy_app) deploys the application this module describes; the
files under deploy/ embed the same config, rendered. After changing it, render them again:
    .venv/bin/python -m eft.api.serve_config
(tests/unit/deploy/test_deploy_files.py fails while a rendered copy differs from this source).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

APP_NAME = "eft"
IMPORT_PATH = "eft.api.deployment:app"
DEPLOYMENT = "EftService"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Settings a cluster deployment passes to the replicas through the Serve config; secrets (the
# database URL, object-store credentials) come from the pods' environment instead.
# The images (Dockerfile) hold the model servers' vLLM environment at /opt/eft/.venv-serve.
CLUSTER_ENV = {"EFT_HOME": "/var/lib/eft", "EFT_SERVING_PYTHON": "/opt/eft/.venv-serve/bin/python"}


def application(env: dict[str, str], num_replicas: int = 1) -> dict[str, Any]:
    """The Serve application entry: the deployment with the `EFT_*` variables `env`."""
    return {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": IMPORT_PATH,
        "runtime_env": {"env_vars": dict(env)},
        "deployments": [{
            "name": DEPLOYMENT,
            "num_replicas": num_replicas,
            # Requests are short and mostly wait on the database: let a replica hold many at
            # once instead of the proxy queueing past Serve's default of 5.
            "max_ongoing_requests": 64,
            # The replica only serves HTTP and schedules: it must not take a CPU a worker needs.
            # It runs on the head, beside the dashboard it submits jobs to (which need listen
            # on nothing but the head's loopback on a cluster-launcher cluster).
            "ray_actor_options": {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}},
        }, model_server(env, env.get("EFT_SERVING_PYTHON") or None)],
    }


MODEL_SERVER = "ModelServer"


def model_server(env: dict[str, str], python: str | None = None) -> dict[str, Any]:
    """The model servers (api/inference.py): they scale with ongoing completions, down to zero
    replicas after `EFT_INFERENCE_IDLE_S` idle seconds. Each takes `EFT_INFERENCE_CPUS` CPUs,
    `EFT_INFERENCE_GPUS` GPUs (a fraction shares one: vLLM then takes that fraction of it) and,
    where set, `EFT_INFERENCE_MEMORY_GB` of its node's memory, and runs `python` (serving_python: vLLM's environment) with
    the service's variables; the engine (vLLM, or transformers' as the fallback) batches up to
    `max_ongoing_requests` requests at once."""
    resources: dict[str, Any] = {"num_cpus": float(env.get("EFT_INFERENCE_CPUS", 1))}
    if float(env.get("EFT_INFERENCE_GPUS", 0)):
        resources["num_gpus"] = float(env["EFT_INFERENCE_GPUS"])
    if float(env.get("EFT_INFERENCE_MEMORY_GB", 0)):
        # Reserved through Ray: training workers and exports are not placed into it, and each
        # engine is checked against its part before it starts (eft/planner/serving.py).
        resources["memory"] = int(float(env["EFT_INFERENCE_MEMORY_GB"]) * 1e9)
    runtime_env: dict[str, Any] = {"env_vars": dict(env)}
    if python:
        runtime_env["py_executable"] = python
    return {
        "name": MODEL_SERVER,
        "max_ongoing_requests": int(env.get("EFT_INFERENCE_MAX_ONGOING", 64)),
        "autoscaling_config": {
            "min_replicas": int(env.get("EFT_INFERENCE_MIN_REPLICAS", 0)),
            "initial_replicas": int(env.get("EFT_INFERENCE_MIN_REPLICAS", 0)),
            "max_replicas": int(env.get("EFT_INFERENCE_MAX_REPLICAS", 1)),
            "target_ongoing_requests": int(env.get("EFT_INFERENCE_TARGET_ONGOING", 32)),
            "downscale_delay_s": float(env.get("EFT_INFERENCE_IDLE_S", 300)),
        },
        "ray_actor_options": {**resources, "runtime_env": runtime_env},
    }


def render(env: dict[str, str] | None = None, port: int = 8000, num_replicas: int = 1) -> dict[str, Any]:
    """The whole Serve config (`serve deploy` / `serveConfigV2`)."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "0.0.0.0", "port": port},
        "applications": [application(CLUSTER_ENV if env is None else env, num_replicas)],
    }


def render_yaml(**kwargs: Any) -> str:
    import yaml

    return yaml.safe_dump(render(**kwargs), sort_keys=False)


def _indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line if line.strip() else line for line in text.splitlines(True))


SERVE_YAML = REPO_ROOT / "deploy" / "serve.yaml"
RAYSERVICE = REPO_ROOT / "deploy" / "kuberay" / "base" / "rayservice.yaml"
_BEGIN, _END = "  # BEGIN rendered by api/serve_config.py\n", "  # END rendered\n"
_SERVE_YAML_HEADER = """\
# Ray Serve config for the eft service, for `serve deploy deploy/serve.yaml` on a running
# cluster. Rendered by `python -m eft.api.serve_config` from api/serve_config.py, the source
# `eft up` and the KubeRay RayService share. Settings and secrets come from EFT_* variables in
# the nodes' environment (see docs/operations.md).
"""


def write() -> None:
    """Render deploy/serve.yaml and the RayService's serveConfigV2 block from `render()`."""
    SERVE_YAML.write_text(_SERVE_YAML_HEADER + render_yaml())
    text = RAYSERVICE.read_text()
    before, rest = text.split(_BEGIN, 1)
    _, after = rest.split(_END, 1)
    block = "  serveConfigV2: |\n" + _indent(render_yaml(), 4)
    RAYSERVICE.write_text(before + _BEGIN + block + _END + after)


if __name__ == "__main__":
    write()
    sys.exit(0)
