"""The one local Ray cluster a test process shares (the training and e2e tiers): started once,
with more logical CPUs than the machine has cores so that a 2-worker job, its driver and the
service fit at once, because each Ray start costs seconds here."""

from __future__ import annotations

import os
from collections.abc import Iterator


def local_ray() -> Iterator[dict[str, str]]:
    """Start a fresh local Ray of our own (never one a stale `ray start` left behind); yields
    its dashboard and Prometheus URLs, and shuts it (and Serve, where it ran) down after."""
    import ray

    from eft.api.local import listen_ports, ray_node_env

    # The node's processes start with the environment `eft up` gives a node (Serve's settings,
    # the workers' priority).
    os.environ.update(ray_node_env(os.environ))
    # Ports the servers bind later, picked where no outbound connection of the starting cluster
    # can take them first (api/local.py:listen_ports).
    dashboard_port, metrics_port = listen_ports(2)
    ray.init(
        address="local",
        num_cpus=8,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        log_to_driver=False,
        configure_logging=False,
        # The node's Prometheus endpoint, at a known port, with metrics exported every second
        # (default 10 s) so that tests see a short job's training metrics while it runs.
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    yield {"dashboard_url": f"http://127.0.0.1:{dashboard_port}",
           "ray_metrics_url": f"http://127.0.0.1:{metrics_port}/metrics"}
    from ray import serve

    serve.shutdown()
    ray.shutdown()
