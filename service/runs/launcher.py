"""Launches job attempts as Ray Jobs and asks Ray about them.

A Ray Job gives each attempt process isolation, a stop signal, captured logs and a row in the
Ray dashboard's Jobs view. The submission id names the job and the attempt
(`ftjob-...-attempt-N`) and is written with the claim, before anything is submitted: a retried
or repeated dispatch can never start one attempt twice (Ray refuses a reused submission id, and
`submit` answers False for it), and a replica that dies between the claim and the submit leaves
an id the scheduler can look up.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from typing import Protocol

from eft.service import credentials
from eft.service.settings import Settings

log = logging.getLogger("eft.launcher")

#: How long a submit waits for a cluster that has no job agent yet (it has just started).
AGENT_WAIT_S = 30.0
#: What Ray's dashboard answers to a submit before any node's job agent has registered.
NO_AGENT = "No available agent to submit job"


class RayJobState:
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    MISSING = "MISSING"  # Ray has no record of it (the head restarted, or it never started)

    TERMINAL = frozenset({STOPPED, SUCCEEDED, FAILED, MISSING})


class Launcher(Protocol):
    def submit(self, job_id: str, attempt: int, name: str | None) -> bool: ...
    def submit_export(self, job_id: str, export_id: int, kind: str = "merged", hub_repo: str | None = None,
                      hub_private: bool = True, memory: int | None = None) -> str: ...
    def state(self, submission_id: str) -> str: ...
    def stop(self, submission_id: str) -> None: ...
    def logs(self, submission_id: str) -> str: ...


def submission_id_for(job_id: str, attempt: int) -> str:
    return f"{job_id}-attempt-{attempt}"


def stop_quietly(launcher: Launcher, submission_id: str) -> None:
    """Ask Ray to stop a Ray Job; a failure is logged, not raised: the scheduler's reconcile
    stops it again on its next pass while the job is still active."""
    try:
        launcher.stop(submission_id)
    except Exception as exc:  # noqa: BLE001 - Ray unreachable, ...
        log.warning("stop of %s failed, the scheduler will retry: %s", submission_id, exc)


class RayJobsLauncher:
    """Talks to the Ray Jobs API of the cluster's dashboard."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._client = None

    @property
    def client(self):  # noqa: ANN201 - JobSubmissionClient, imported lazily
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.settings.ray_dashboard_url)
        return self._client

    def submit(self, job_id: str, attempt: int, name: str | None) -> bool:
        """Start the driver of one attempt under `submission_id_for(job_id, attempt)`. Returns
        True when submitted now, False when Ray already has that attempt (a repeated dispatch)."""
        submission_id = submission_id_for(job_id, attempt)
        entrypoint = (
            f"{shlex.quote(sys.executable)} -m eft.service.runs.entrypoint "
            f"--job-id {shlex.quote(job_id)} --attempt {attempt}"
        )
        # No credential in the runtime environment, entrypoint or metadata: Ray's dashboard API
        # shows all three to anyone who reaches it (service/credentials.py).
        env = {
            **self.settings.driver_environment(),
            # Shows the Train run in the dashboard's Train view.
            "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",
        }
        runtime_env: dict[str, object] = {"env_vars": env}
        if credentials.FILE_VAR in env:
            # The job's worker processes (Train controller and workers) read the file first.
            runtime_env["worker_process_setup_hook"] = credentials.SETUP_HOOK
        metadata = {"eft_job_id": job_id, "eft_attempt": str(attempt)}
        if name:
            metadata["eft_job_name"] = name[:200]
            # The key Ray's dashboard lists as the job's name in its Jobs view.
            metadata["job_name"] = f"{name[:180]} ({job_id})"
        try:
            self._submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata=metadata,
                # The driver only coordinates; it must not take a CPU a worker needs.
                entrypoint_num_cpus=0,
            )
        except RuntimeError as exc:  # the SDK's error for a refused request
            if "already exists" in str(exc):
                return False
            raise
        return True

    def submit_export(self, job_id: str, export_id: int, kind: str = "merged", hub_repo: str | None = None,
                      hub_private: bool = True, memory: int | None = None) -> str:
        """Start the Ray Job that exports a succeeded job's model (service/serving/exports.py): merges
        it, pushes it to the Hub, or both, reserving `memory` bytes of its node's (so that
        exports wait for room instead of crowding a node out). Returns its submission id."""
        submission_id = f"{job_id}-export-{export_id}"
        options = f" --kind {shlex.quote(kind)}"
        if hub_repo:
            options += f" --hub-repo {shlex.quote(hub_repo)}" + ("" if hub_private else " --hub-public")
        env = self.settings.driver_environment()
        runtime_env: dict[str, object] = {"env_vars": env}
        if credentials.FILE_VAR in env:
            runtime_env["worker_process_setup_hook"] = credentials.SETUP_HOOK
        try:
            self._submit_job(
                entrypoint=(f"{shlex.quote(sys.executable)} -m eft.service.serving.exports "
                            f"--job-id {shlex.quote(job_id)} --export-id {int(export_id)}{options}"),
                submission_id=submission_id, runtime_env=runtime_env,
                metadata={"eft_job_id": job_id, "eft_export_id": str(export_id),
                          "job_name": f"merged export of {job_id}"},
                # It loads and merges the model itself: one CPU, and the memory that takes.
                entrypoint_num_cpus=1, entrypoint_memory=memory,
            )
        except RuntimeError as exc:
            if "already exists" not in str(exc):
                raise
        return submission_id

    def _submit_job(self, **kwargs) -> None:
        """`submit_job`, waiting up to AGENT_WAIT_S for the cluster's job agent: a cluster that
        has just started (or a head that restarted) refuses jobs until its agents register,
        which is not the job's fault and must not use up its dispatch attempts."""
        deadline = time.monotonic() + AGENT_WAIT_S
        pause = 0.5
        while True:
            try:
                self.client.submit_job(**kwargs)
                return
            except RuntimeError as exc:
                if NO_AGENT not in str(exc) or time.monotonic() + pause > deadline:
                    raise
                log.info("no Ray job agent yet for %s, retrying in %.1fs", kwargs.get("submission_id"), pause)
                time.sleep(pause)
                pause = min(pause * 2, 4.0)

    def state(self, submission_id: str) -> str:
        try:
            info = self.client.get_job_info(submission_id)
        except RuntimeError as exc:  # the SDK raises RuntimeError for an unknown id
            if "does not exist" in str(exc) or "404" in str(exc):
                return RayJobState.MISSING
            raise
        return str(info.status.value)

    def stop(self, submission_id: str) -> None:
        try:
            self.client.stop_job(submission_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                raise

    def logs(self, submission_id: str) -> str:
        try:
            return self.client.get_job_logs(submission_id)
        except RuntimeError:
            return ""
