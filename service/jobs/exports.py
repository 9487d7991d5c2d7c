"""A succeeded job's exports, as the service starts and lists them: its adapter (the artifact
itself) and merged models, each written by a Ray Job (service/serving/exports.py) and recorded as
the job's events, so that every replica sees the same list."""

from __future__ import annotations

from typing import Any

from eft.service import credentials
from eft.service.accounts.quotas import QuotaExceeded
from eft.service.errors import Conflict, ServiceError
from eft.service.runs.launcher import Launcher, RayJobState
from eft.service.serving import exports as runner
from eft.service.settings import Settings
from eft.service.store.db import tenant_key
from eft.service.store.store import Store
from eft.types.jobs import JobStatus


class HubPushRefused(ServiceError):
    status_code = 403
    type = "permission_error"
    code = "hub_push_not_allowed"


class TooManyExports(QuotaExceeded):
    code = "exports_limit"


class Exports:
    """The exports of one service's jobs."""

    def __init__(self, store: Store, launcher: Launcher, settings: Settings):
        self.store, self.launcher, self.settings = store, launcher, settings

    def list(self, job_id: str, tenant: str | None) -> list[dict[str, Any]]:
        """The job's exports, oldest first: its adapter (once it succeeded) and every merged
        export asked for. A merged export whose Ray Job ended without saying how is failed."""
        job = self.store.get_job(job_id, tenant)
        events, _ = self.store.list_events(job.id, limit=100_000, types=[runner.STARTED, runner.DONE, runner.FAILED])
        found = runner.exports_from_events(job.id, [vars(e) for e in events])
        ended = {e["id"]: self.launcher.state(e["ray_submission_id"]) for e in found
                 if e["status"] == "running" and e.get("ray_submission_id")}
        ended = {k: v for k, v in ended.items() if v in RayJobState.TERMINAL}
        if ended:  # read again: an export that finished meanwhile has said so by now
            events, _ = self.store.list_events(job.id, limit=100_000,
                                               types=[runner.STARTED, runner.DONE, runner.FAILED])
            found = runner.exports_from_events(job.id, [vars(e) for e in events])
            for export in found:
                if export["status"] == "running" and export["id"] in ended:
                    export.update(status="failed",
                                  error=f"its Ray Job ended ({ended[export['id']]}) without writing the model")
        if job.status is JobStatus.succeeded and job.artifact_path:
            found.insert(0, {"object": "export", "id": 0, "job_id": job.id, "kind": "adapter", "status": "succeeded",
                             "path": job.artifact_path, "error": None, "created_at": job.finished_at,
                             "finished_at": job.finished_at})
        return found

    def start(self, job_id: str, tenant: str | None, kind: str, hub_repo: str | None = None,
               hub_private: bool = True) -> tuple[dict[str, Any], bool]:
        """Export the job's model as `kind` ("merged" or "adapter"), and push it to the Hub
        repository `hub_repo` if given. Returns (the export, whether this call started it): an
        export of the same kind and repository already running or done is returned as it is.
        Raises Conflict (409) for a job that has not succeeded, ServiceError (400) for a push
        the operator gave no Hub token for."""
        job = self.store.get_job(job_id, tenant)
        if job.status is not JobStatus.succeeded or not job.artifact_path:
            raise Conflict(f"job {job.id} is {job.status.value}: only a succeeded job's model can be exported",
                           code="job_not_succeeded", param="job_id")
        if (job.config or {}).get("method") == "full" and kind == "merged":
            raise Conflict(f"job {job.id} trained the whole model: its artifact is already a full model; download it",
                           code="nothing_to_merge", param="kind")
        if hub_repo and not credentials.hub_token():
            raise ServiceError("this server has no Hugging Face token: the operator sets HF_TOKEN in the service's "
                               "environment or secrets file to let jobs push to the Hub", param="hub_repo",
                               code="hub_token_missing")
        if hub_repo:
            allowed = self.settings.hub_push_namespaces.get(job.tenant, [])
            if hub_repo.split("/", 1)[0] not in allowed:
                where = (f"push to {', '.join(repr(n + '/...') for n in allowed)}" if allowed
                         else "the operator has given this tenant no Hub namespace to push to")
                raise HubPushRefused(f"exports may not push to {hub_repo!r} with this server's token: {where} "
                                     "(EFT_HUB_PUSH_NAMESPACES)", param="hub_repo")
        known = self.list(job.id, tenant)
        for export in reversed(known):
            if (export["kind"] == kind and export.get("hub_repo") == hub_repo
                    and export["status"] in ("running", "succeeded")):
                return export, False
        export_id = max((e["id"] for e in known), default=0) + 1
        submission_id = f"{job.id}-export-{export_id}"
        path = runner.destination(job.artifact_path, kind) if kind == "merged" else job.artifact_path
        with self.store.serialized(tenant_key(job.tenant)) as conn:  # counted and claimed at once
            running = [s for _, _, s in runner.open_exports(self.store.engine, job.tenant)
                       if not s or self.launcher.state(s) not in RayJobState.TERMINAL]
            if len(running) >= self.settings.exports_per_tenant:
                raise TooManyExports(
                    f"{len(running)} exports of this tenant's jobs are running, as many as this server runs at once "
                    "(EFT_EXPORTS_PER_TENANT): ask again when one has finished (GET /jobs/{id}/exports)",
                    "kind", self.settings.quota_retry_after_s)
            self.store.insert_event(conn, job.id, runner.STARTED, f"{kind} export {export_id} started", data={
                "export_id": export_id, "kind": kind, "path": path, "hub_repo": hub_repo,
                "ray_submission_id": submission_id})
        memory = runner.memory_needed((job.config or {}).get("model_path"), kind)
        try:
            self.launcher.submit_export(job.id, export_id, kind, hub_repo, hub_private, memory=memory)
        except Exception as exc:
            self.store.append_event(job.id, runner.FAILED, f"{kind} export could not start: {exc}",
                                    data={"export_id": export_id, "kind": kind}, level="error")
            raise
        return next(e for e in self.list(job.id, tenant) if e["id"] == export_id), True

    def location(self, job_id: str, tenant: str | None, kind: str) -> str:
        """Where the job's finished `kind` export is. Raises Conflict (409 `export_not_available`)
        while none has been written."""
        done = [e for e in self.list(job_id, tenant) if e["kind"] == kind]
        ready = [e for e in done if e["status"] == "succeeded"]
        if not ready:
            state = done[-1]["status"] if done else "not asked for"
            raise Conflict(f"the {kind} export of job {job_id} is {state}: start it with POST /jobs/{job_id}/export "
                           "and wait until GET /jobs/{id}/exports says succeeded", code="export_not_available",
                           param="export")
        return ready[-1]["path"]
