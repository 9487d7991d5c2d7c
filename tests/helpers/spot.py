"""Spot nodes on this machine: extra Ray nodes that join the test process's cluster, each offering
one slot of the `eft_test_spot` resource, and go away as a spot reclaim makes them go."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.jobs import SPOT, until


#: How far ahead of the training workers a spot node's own processes start (niceness steps).
NODE_PRIORITY_BOOST = 10


def _ahead_of_workers() -> None:
    """In the child, before `ray start`: a higher priority where the test may set one (root)."""
    try:
        os.nice(-NODE_PRIORITY_BOOST)
    except OSError:
        pass


def _free_ports(count: int) -> list[int]:
    """`count` ports free on this machine now (the kernel's choice, all bound at once so that
    they differ)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class SpotNodes:
    """Extra Ray nodes on this machine, each offering one `eft_test_spot` slot, as spot nodes
    do. SIGTERM to a node's `ray start --block` drains it first (a preemption notice with a
    deadline), as a spot reclaim does."""

    def __init__(self, gcs_address: str, log_dir: Path):
        self.gcs_address, self.log_dir = gcs_address, log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, attempts: int = 3) -> subprocess.Popen:
        """A new node, once it has joined. On a loaded machine `ray start` can still give up on
        its own (Ray waits a fixed 30 s for the new raylet to register): a node that exits
        before it joined is started again, up to `attempts` times."""
        for attempt in range(1, attempts + 1):
            proc = self._launch()
            if until("the new node to join", lambda: self._joined(proc)) == "joined":
                return proc
            if attempt == attempts:
                log = (self.log_dir / f"node-{len(self.procs) - 1}.log").read_text()[-3000:]
                pytest.fail(f"`ray start` exited {attempts} times before its node joined; last log:\n{log}")
        raise AssertionError("unreachable")

    def _launch(self) -> subprocess.Popen:
        import ray

        self._before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        # A 15 s notice (GCP and Azure give 30 s, AWS 2 min): the service's preemption watch
        # polls every 0.5 s here (EFT_PREEMPTION_POLL_INTERVAL_S), and the preemption checkpoint
        # is saved and registered within a second or two of the notice; an elastic job then
        # goes on without the node at once, a fixed-size one waits out the notice.
        # A new raylet waits a fixed 15 s for each port its agents (Python processes with a
        # large import) write to a file, and dies past it; `ray start` gives up after 30 s. On
        # two cores that training workers fill, both happen. The agents' ports are given on the
        # command line instead, so the raylet has nothing to wait for (the agents still start,
        # and the node is told about them as on a node of a real cluster with fixed ports);
        # the node's own processes start ahead of the workers (where this process may raise a
        # priority), and its workers go back to the priority the head's run at.
        env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "15",
               "RAY_worker_niceness": str(NODE_PRIORITY_BOOST)}
        metrics_export, agent_grpc, agent_listen, runtime_env = _free_ports(4)
        log = open(self.log_dir / f"node-{len(self.procs)}.log", "w")
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("ray")), "start", f"--address={self.gcs_address}", "--num-cpus=1",
             f'--resources={{"{SPOT}": 1}}', f"--metrics-export-port={metrics_export}",
             f"--dashboard-agent-grpc-port={agent_grpc}", f"--dashboard-agent-listen-port={agent_listen}",
             f"--runtime-env-agent-port={runtime_env}", "--block"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_ahead_of_workers,
        )
        self.procs.append(proc)
        return proc

    def _joined(self, proc: subprocess.Popen) -> str | None:
        """"joined" once the node is alive in the cluster, "exited" if `ray start` gave up first."""
        import ray

        if any(n["Alive"] and n["NodeID"] not in self._before and SPOT in n["Resources"] for n in ray.nodes()):
            return "joined"
        return "exited" if proc.poll() is not None else None

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
