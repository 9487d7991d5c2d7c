"""The whole Ray cluster, head included, dies mid-job and comes back: the job resumes.

This test runs its own Ray head (`ray start --head --block` on ports of its own), since the
session cluster must stay up for the other tests, and talks to it only through subprocesses and
HTTP (this process is connected to the session cluster). Its state outside Ray (EFT_HOME with the
SQLite job store and the checkpoint root) survives the restart, as a database and object storage
do on a real cluster. The head's process group is SIGKILLed, as when a head node is lost; a new
head starts on the same ports, the service is deployed again, and its reconcile finds the job's
Ray Job gone, queues it again, and attempt 2 resumes from the checkpoint attempt 1 left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from eft.api.local import listen_ports
from tests.helpers.service_api import api, use_admin_key, wait_for
from tests.helpers.jobs import checkpointed, events_of, lora_body, post, trained_steps, until

RAY = str(Path(sys.executable).with_name("ray"))
# This cluster's processes and clients: no stale RAY_ADDRESS, and no token auth (the token a new
# head generates is not where the separate deploy process would look for it).
CLUSTER_ENV = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "disabled"}
STEPS = 80
DEPLOY = """
import json, sys, ray
from eft.api.local import deploy_app
ray.init(address=sys.argv[1], log_to_driver=False)
deploy_app(json.loads(sys.argv[2]), int(sys.argv[3]))
"""


class Head:
    """A Ray head of this test's own, started and ended by pid."""

    def __init__(self, root: Path):
        self.root = root
        # Ray's socket paths must stay under 107 characters: a short temp dir of its own.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="eftray-", dir="/tmp"))
        ports = iter(listen_ports(7))  # distinct, and none an outbound connection may take first
        self.gcs_port, self.dashboard_port, self.http_port = next(ports), next(ports), next(ports)
        self.agent_ports = {flag: next(ports) for flag in (
            "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
            "metrics-export-port")}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> None:
        self.starts += 1
        log = open(self.root / f"head-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [RAY, "start", "--head", f"--port={self.gcs_port}", "--num-cpus=4",
             f"--dashboard-port={self.dashboard_port}", "--dashboard-host=127.0.0.1",
             # Ports of its own, so that it never meets another cluster on this machine.
             *(f"--{flag}={port}" for flag, port in self.agent_ports.items()),
             f"--temp-dir={self.temp_dir}", "--disable-usage-stats", "--block"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=CLUSTER_ENV,
        )
        until("the new head's Jobs API", self._answers, timeout_s=180)

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"the head exited: {(self.root / f'head-{self.starts}.log').read_text()[-3000:]}")
        try:
            return api.get(f"{self.dashboard_url}/api/version", timeout=5).status_code in (200, 401)
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def deploy(self, env: dict[str, str]) -> str:
        subprocess.run([sys.executable, "-c", DEPLOY, self.address, json.dumps(env), str(self.http_port)],
                       check=True, timeout=300, env=CLUSTER_ENV)
        url = f"http://127.0.0.1:{self.http_port}"
        from eft.api.local import wait_healthy

        wait_healthy(url, timeout_s=180)
        return url

    def kill(self) -> None:
        """Lose the head: SIGKILL its whole process group (GCS, raylet, dashboard, workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_leftovers(job_id: str) -> None:
    """Processes of the job that left the head's process group (Ray Jobs starts its drivers in
    a session of their own): ended by pid."""
    found = subprocess.run(["pgrep", "-f", f"eft.service.runs.entrypoint --job-id {job_id}"],
                           capture_output=True, text=True).stdout.split()
    for pid in found:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def own_head(tmp_path):
    head = Head(tmp_path)
    yield head
    head.remove()


def test_the_job_resumes_after_the_whole_cluster_restarts(own_head, tmp_path):
    home = tmp_path / "eft-home"
    (home / "data").mkdir(parents=True)
    env = {"EFT_HOME": str(home), "EFT_RAY_DASHBOARD_URL": own_head.dashboard_url,
           "EFT_SCHEDULER_INTERVAL_S": "0.5", "EFT_WORKER_START_TIMEOUT_S": "20",
           # A Ray Job the restarted head has never heard of counts as lost after 5 s here.
           "EFT_DISPATCH_GRACE_S": "5", "EFT_ADMIN_API_KEY": use_admin_key()}
    own_head.start()
    url = own_head.deploy(env)
    job = post(url, lora_body("head-restart", STEPS, workers=1, checkpoint={"every_steps": 20}))
    jid = job["id"]
    try:
        latest = until("a checkpoint before the head is lost", lambda: checkpointed(url, jid, 20))
        own_head.kill()
        _kill_leftovers(jid)
        started = time.monotonic()
        own_head.start()
        url = own_head.deploy(env)
        done = wait_for(jid, url, {"succeeded"}, timeout_s=400)
        recovery_s = time.monotonic() - started
    finally:
        _kill_leftovers(jid)

    assert done["attempt"] == 2 and done["restarts"] == 1, done
    events = events_of(url, jid)
    restarted = [e for e in events if e["type"] == "restarted"]
    assert [e["data"]["reason"] for e in restarted] == ["driver_lost"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["attempt"] == 2 and resumed[0]["data"]["step"] >= latest
    assert [e["data"]["submission_id"] for e in events if e["type"] == "submitted"] == [
        f"{jid}-attempt-1", f"{jid}-attempt-2"]
    assert sorted(set(trained_steps(url, jid))) == list(range(1, STEPS + 1))
    print(f"head restart to job finished: {recovery_s:.1f}s")
