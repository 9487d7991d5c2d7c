"""Spot nodes on this machine: extra Ray nodes that join the test process's cluster, each offering
one slot of the `eft_test_spot` resource, and go away as a spot reclaim makes them go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.jobs import SPOT, until


class SpotNodes:
    """Extra Ray nodes on this machine, each offering one `eft_test_spot` slot, as spot nodes
    do. SIGTERM to a node's `ray start --block` drains it first (a preemption notice with a
    deadline), as a spot reclaim does."""

    def __init__(self, gcs_address: str, log_dir: Path):
        self.gcs_address, self.log_dir = gcs_address, log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        import ray

        before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        # A 15 s notice (GCP and Azure give 30 s, AWS 2 min): the service's preemption watch
        # polls every 0.5 s here (EFT_PREEMPTION_POLL_INTERVAL_S), and the preemption checkpoint
        # is saved and registered within a second or two of the notice; an elastic job then
        # goes on without the node at once, a fixed-size one waits out the notice.
        env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "15"}
        log = open(self.log_dir / f"node-{len(self.procs)}.log", "w")
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("ray")), "start", f"--address={self.gcs_address}", "--num-cpus=1",
             f'--resources={{"{SPOT}": 1}}', "--block"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.procs.append(proc)
        until("the new node to join", lambda: any(
            n["Alive"] and n["NodeID"] not in before and SPOT in n["Resources"] for n in ray.nodes()))
        return proc

    def drain(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
