"""The job manager: the one home of the rules of a job, behind every route (`/jobs` and `/v1`).

Route functions in `api/routes/` stay small and call these once; everything here works on the
store and the launcher, and returns wire models. Creating a job is one call, `JobService.create`:
tenant checks on file ids, quotas, the request's checks and its plan, and replay of a repeated
`Idempotency-Key`, in that order.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from eft.types.jobs import (
    Job,
    JobCreate,
    JobEvent,
    JobEventList,
    JobList,
    JobMetric,
    JobMetricList,
    JobStatus,
)
from eft.service.auth import Principal
from eft.service.errors import Conflict, JobNotFound, ModelNotFound, Problem, RequestInvalid, ServiceError
from eft.service.file_checks import check_job_files
from eft.service.files import FileStore
from eft.service.inference import AdapterSource, BaseSource
from eft.service.idempotency import Idempotency, request_digest
from eft.service.model_ids import checkpoint_model_id, parse_model_id
from eft.service import exports, queueing
from eft.service.launcher import Launcher, RayJobState, stop_quietly
from eft.service.wire import model_id, to_wire
from eft.service.quotas import QuotaExceeded, check_priority, check_quota, demand
from eft.service.settings import Settings
from eft.service.db import tenant_key
from eft.service.store import JobRecord, Store
from eft.service.paths import resolve_under_roots
from eft.service.requests.check import check_request
from eft.types.text import decimal_int

log = logging.getLogger("eft.jobs")


#: Reads and writes a cancel makes before it gives up on a job that keeps changing status.
CANCEL_TRIES = 5


class HubPushRefused(ServiceError):
    status_code = 403
    type = "permission_error"
    code = "hub_push_not_allowed"


class TooManyExports(QuotaExceeded):
    code = "exports_limit"


class JobService:
    def __init__(self, store: Store, launcher: Launcher, settings: Settings,
                 on_created: Callable[[], None] | None = None,
                 files: FileStore | None = None, idempotency: Idempotency | None = None):
        self.store, self.launcher, self.settings = store, launcher, settings
        #: Called after a job is stored (the replica's scheduler wakes to validate it).
        self.on_created = on_created
        self.files = files or FileStore(store.engine, settings)
        self.idempotency = idempotency or Idempotency(store.engine)
        #: The dispatch order and cluster plan queued jobs' reads share (service/queueing.py).
        self.queue_cache = queueing.QueueCache(store, settings)

    def create(self, req: JobCreate, principal: Principal, idempotency_key: str | None = None, *,
               endpoint: str = "POST /jobs", body: Any = None) -> tuple[Job, bool]:
        """Create a job for `principal`, once per `idempotency_key`: a repeat with the same
        `body` (the request as the route received it; `req` when not given) returns the first
        job, with another body it is a 409.

        Returns (job, created now). Raises RequestInvalid listing every problem, QuotaExceeded
        over a tenant limit, Conflict for a reused key; nothing is stored then.
        """

        def admit(conn) -> None:  # noqa: ANN001 - in the insert's serialized transaction
            check_job_files(req, principal.scope, self.files, conn)  # not deleted meanwhile
            check_quota(self.store, principal.tenant, req, self.settings, conn)

        created: list[JobRecord] = []

        continued: dict[str, Any] = {}

        def create_once() -> str:
            nonlocal req
            check_job_files(req, principal.scope, self.files)
            self.check_webhook(req, principal.tenant)
            req, init = self.resolve_continuation(req, principal.tenant)
            continued.update(init or {})
            # A quick refusal before the request's checks; the binding check is repeated in the
            # insert's own serialized transaction.
            check_quota(self.store, principal.tenant, req, self.settings)
            check_priority(principal.tenant, req, self.settings)
            inputs = check_request(req, self.settings)
            record = self.store.create_job(
                tenant=principal.tenant, request=req.model_dump(mode="json"), name=req.name,
                plan={**inputs.choice.to_dict(), **({"init_from": continued} if continued else {})},
                demand=demand(req),
                admit=admit)
            created.append(record)
            if self.on_created is not None:
                self.on_created()
            return record.id

        digest = request_digest((body if body is not None else req).model_dump(mode="json"))
        job_id, now = self.idempotency.run(principal.tenant, idempotency_key, endpoint, digest, create_once)
        if created:  # the job as stored (a new job has no metrics): no second read
            return to_wire(created[0]), now
        return self.get(job_id, principal.tenant), now

    def resolve_continuation(self, req: JobCreate, tenant: str) -> tuple[JobCreate, dict[str, Any] | None]:
        """A request that continues another job (`from_checkpoint`, or a fine-tuned model id as
        `model`), made explicit: its `model` the source's base, its adapter shape the source's,
        `from_checkpoint` as `<job id>:<step>`; and where that checkpoint is. Raises
        RequestInvalid naming the field for an unknown job or checkpoint."""
        source, param = req.from_checkpoint, "from_checkpoint"
        if source is None and req.model.startswith("ft:"):
            source, param = req.model, "model"
        if source is None:
            return req, None
        ref = parse_model_id(source)
        job_id, step = (ref.job_id, ref.step) if ref is not None else (source.partition(":")[0], None)
        if ref is None and ":" in source:
            text = source.partition(":")[2]
            step = decimal_int(text)
            if step is None:
                raise RequestInvalid(problems=[Problem(param, "invalid_checkpoint", f"{source!r} is not "
                                                       "`<job id>:<step>`, `<job id>` or a checkpoint's model id")])
        try:
            job = self.store.get_job(job_id, tenant)
        except JobNotFound:
            raise RequestInvalid(problems=[Problem(param, "checkpoint_not_found", f"no job {job_id!r} of yours "
                                                   "to continue from: list them with GET /jobs")]) from None
        kept = [c for c in self._checkpoints_of(job) if c["available"]]
        chosen = (next((c for c in kept if c["step"] == step), None) if step is not None
                  else max(kept, key=lambda c: c["step"], default=None))
        if chosen is None:
            steps = ", ".join(str(c["step"]) for c in sorted(kept, key=lambda c: c["step"])) or "none"
            raise RequestInvalid(problems=[Problem(
                param, "checkpoint_not_found", f"job {job_id} has no kept checkpoint"
                + (f" at step {step}" if step is not None else "") + f" (kept: {steps}): pick one of "
                f"GET /jobs/{job_id}/checkpoints")])
        source_request = JobCreate.model_validate(job.request)
        tuning = source_request.tuning
        method = (req.method.model_copy(update={"tuning": tuning}) if req.objective == "dpo" else tuning)
        resolved = req.model_copy(update={"model": source_request.model, "method": method,
                                          "from_checkpoint": f"{job.id}:{chosen['step']}"})
        return resolved, {"job_id": job.id, "step": int(chosen["step"]), "path": chosen["path"],
                          "optimizer": req.restore_optimizer}

    def check_webhook(self, req: JobCreate, tenant: str) -> None:
        """A job's `webhook_url` must be one this server sends to, and the tenant must have a
        signing secret (made by POST /webhooks/secret or its first endpoint). Raises RequestInvalid."""
        if not req.webhook_url:
            return
        from eft.service import webhooks

        settings = self.settings
        problem = webhooks.url_problem(req.webhook_url, settings.webhook_allow_loopback, settings.webhook_allow_private,
                                      settings.webhook_dns_timeout_s)
        if problem:
            raise RequestInvalid(problems=[Problem("webhook_url", "webhook_url_refused", f"the webhook URL {problem}")])
        if not webhooks.has_secret(self.store.engine, tenant):
            raise RequestInvalid(problems=[Problem(
                "webhook_url", "webhook_secret_missing", "webhooks are signed with your tenant's secret, which it "
                "has not made yet: POST /webhooks/secret (shown once), then create the job again")])

    def get(self, job_id: str, tenant: str) -> Job:
        job = self.store.get_job(job_id, tenant)
        wire = to_wire(job, self.store.latest_metric_values([job.id]).get(job.id))
        if job.status is JobStatus.queued:  # its place in line (read once per GET of a queued job)
            wire.queue = queueing.position(self.store, self.settings, job, cache=self.queue_cache)
        return wire

    def list(self, tenant: str, limit: int, after: str | None, status: JobStatus | None,
             metadata: dict[str, str] | None = None) -> JobList:
        records, has_more = self.store.list_jobs(
            tenant=tenant, limit=limit, after=after, statuses=[status] if status else None, metadata_filter=metadata
        )
        latest = self.store.latest_metric_values(r.id for r in records)
        data = [to_wire(r, latest.get(r.id)) for r in records]
        return JobList(data=data, has_more=has_more, next_cursor=data[-1].id if has_more else None)

    def cancel(self, job_id: str, tenant: str) -> Job:
        """Stop a job. Raises Conflict for a job that has already ended. A job the scheduler
        moves on meanwhile (validated, dispatched) is read again and cancelled from there."""
        for _ in range(CANCEL_TRIES):
            job = self.store.get_job(job_id, tenant)
            if job.status.is_terminal:
                raise Conflict(f"job {job_id} already {job.status.value}; nothing to cancel",
                               code="job_already_finished", param="job_id")
            if job.status is JobStatus.cancelling:
                return to_wire(job)
            try:
                if job.status in (JobStatus.running, JobStatus.pausing):
                    job = self.store.transition(job_id, JobStatus.cancelling, "cancel requested",
                                                expected_status=job.status)
                    if job.submission_id:
                        stop_quietly(self.launcher, job.submission_id)
                else:
                    job = self.store.transition(job_id, JobStatus.cancelled, "cancelled before it ran",
                                                expected_status=job.status)
            except Conflict:
                continue  # its status changed between the read and the write
            return to_wire(job)
        raise Conflict(f"job {job_id} kept changing status; try the cancel again", code="job_busy",
                       param="job_id")

    def pause(self, job_id: str, tenant: str) -> Job:
        """Pause a job. A running one checkpoints at once (as on a preemption notice), releases
        its workers and ends `paused`; a queued one is held back. Raises Conflict for a job in
        any other status, naming it."""
        for _ in range(CANCEL_TRIES):
            job = self.store.get_job(job_id, tenant)
            if job.status in (JobStatus.pausing, JobStatus.paused):
                if (job.schedule or {}).get("paused"):
                    # Paused by the scheduler to make room: the owner's pause now holds it, and
                    # the scheduler no longer queues it again when room frees.
                    self.store.set_schedule(job_id, {**job.schedule, "paused": False, "held_by_owner": True},
                                            statuses=(JobStatus.pausing, JobStatus.paused))
                    job = self.store.get_job(job_id, tenant)
                return to_wire(job)
            if job.status not in (JobStatus.running, JobStatus.queued):
                raise Conflict(f"job {job_id} is {job.status.value}: only a running or queued job can be paused"
                               + ("; wait until it is queued" if job.status is JobStatus.validating else ""),
                               code="job_not_pausable", param="job_id")
            try:
                if job.status is JobStatus.running:
                    job = self.store.transition(job_id, JobStatus.pausing, "pause requested: the workers "
                                                "checkpoint at the next check and stop", expected_status=job.status)
                else:
                    job = self.store.transition(job_id, JobStatus.paused, "paused before it ran",
                                                expected_status=job.status, data={"step": job.step})
            except Conflict:
                continue
            return to_wire(job)
        raise Conflict(f"job {job_id} kept changing status; try the pause again", code="job_busy", param="job_id")

    def resume(self, job_id: str, tenant: str) -> Job:
        """Queue a paused job again: its next attempt resumes from the pause checkpoint with as
        many workers as the cluster gives (between the job's minimum and maximum). Raises
        Conflict for a job that is not paused."""
        job = self.store.get_job(job_id, tenant)
        if job.status is not JobStatus.paused:
            raise Conflict(f"job {job_id} is {job.status.value}, not paused: only a paused job can be resumed",
                           code="job_not_paused", param="job_id")
        # A paused job holds no quota (the tenant may run others meanwhile): resuming it takes
        # quota again, checked as a create is, in the same serialized transaction.
        request = JobCreate.model_validate(job.request)
        resumed = self.store.requeue(
            job, f"resume requested at step {job.step}", event_type="resume_requested", data={"step": job.step},
            admit=lambda conn: check_quota(self.store, tenant, request, self.settings, conn))
        job = resumed if resumed is not None else self.store.get_job(job_id, tenant)
        if self.on_created is not None:
            self.on_created()  # wake the scheduler, as for a new job
        return to_wire(job)

    def events(self, job_id: str, tenant: str, after: int | None, limit: int) -> JobEventList:
        self.store.get_job(job_id, tenant)
        events, has_more = self.store.list_events(job_id, after=after, limit=limit)
        return JobEventList(
            data=[JobEvent(id=e.id, job_id=e.job_id, created_at=e.created_at, attempt=e.attempt, type=e.type,
                           level=e.level, message=e.message, data={**e.data, "attempt": e.attempt})
                  for e in events],
            has_more=has_more,
        )

    def metrics(self, job_id: str, tenant: str, after_step: int | None = None,
                limit: int = 10_000) -> JobMetricList:
        self.store.get_job(job_id, tenant)
        rows = self.store.list_metrics(job_id, after_step=after_step, limit=limit + 1)
        return JobMetricList(data=[JobMetric(**m) for m in rows[:limit]], has_more=len(rows) > limit)

    def checkpoints(self, job_id: str, tenant: str) -> list[dict[str, Any]]:
        """The job's checkpoints, oldest first, each with its model id (`<job's id>:ckpt-<step>`)."""
        return self._checkpoints_of(self.store.get_job(job_id, tenant))

    def _checkpoints_of(self, job: JobRecord) -> list[dict[str, Any]]:
        """The job's checkpoints with their model ids, validation losses, and the kept one with
        the lowest validation loss marked `best`."""
        model = model_id(job)
        found = [{**c, "model": checkpoint_model_id(model, c["step"]),
                  "eval_loss": (c.get("metrics") or {}).get("eval_loss")} for c in self.store.list_checkpoints(job.id)]
        # The best step as the job judged it (with its min_delta) when it saved its newest
        # evaluated checkpoint; else the kept checkpoint with the lowest loss.
        judged = [c["metrics"]["best_step"] for c in sorted(found, key=lambda c: c["step"])
                  if isinstance((c.get("metrics") or {}).get("best_step"), (int, float))]
        kept = [c for c in found if c["available"] and isinstance(c["eval_loss"], (int, float))]
        best = next((c for c in kept if judged and c["step"] == int(judged[-1])), None)
        if best is None:  # that one was pruned, or evaluations fell between checkpoints
            best = min(kept, key=lambda c: (c["eval_loss"], c["step"]), default=None)
        for c in found:
            c["best"] = c is best
        return found

    def exports(self, job_id: str, tenant: str | None) -> list[dict[str, Any]]:
        """The job's exports, oldest first: its adapter (once it succeeded) and every merged
        export asked for. A merged export whose Ray Job ended without saying how is failed."""
        job = self.store.get_job(job_id, tenant)
        events, _ = self.store.list_events(job.id, limit=100_000, types=[exports.STARTED, exports.DONE, exports.FAILED])
        found = exports.exports_from_events(job.id, [vars(e) for e in events])
        ended = {e["id"]: self.launcher.state(e["ray_submission_id"]) for e in found
                 if e["status"] == "running" and e.get("ray_submission_id")}
        ended = {k: v for k, v in ended.items() if v in RayJobState.TERMINAL}
        if ended:  # read again: an export that finished meanwhile has said so by now
            events, _ = self.store.list_events(job.id, limit=100_000,
                                               types=[exports.STARTED, exports.DONE, exports.FAILED])
            found = exports.exports_from_events(job.id, [vars(e) for e in events])
            for export in found:
                if export["status"] == "running" and export["id"] in ended:
                    export.update(status="failed",
                                  error=f"its Ray Job ended ({ended[export['id']]}) without writing the model")
        if job.status is JobStatus.succeeded and job.artifact_path:
            found.insert(0, {"object": "export", "id": 0, "job_id": job.id, "kind": "adapter", "status": "succeeded",
                             "path": job.artifact_path, "error": None, "created_at": job.finished_at,
                             "finished_at": job.finished_at})
        return found

    def export(self, job_id: str, tenant: str | None, kind: str, hub_repo: str | None = None,
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
        if hub_repo and not exports.hub_token():
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
        known = self.exports(job.id, tenant)
        for export in reversed(known):
            if (export["kind"] == kind and export.get("hub_repo") == hub_repo
                    and export["status"] in ("running", "succeeded")):
                return export, False
        export_id = max((e["id"] for e in known), default=0) + 1
        submission_id = f"{job.id}-export-{export_id}"
        path = exports.destination(job.artifact_path, kind) if kind == "merged" else job.artifact_path
        with self.store.serialized(tenant_key(job.tenant)) as conn:  # counted and claimed at once
            running = [s for _, _, s in exports.open_exports(self.store.engine, job.tenant)
                       if not s or self.launcher.state(s) not in RayJobState.TERMINAL]
            if len(running) >= self.settings.exports_per_tenant:
                raise TooManyExports(
                    f"{len(running)} exports of this tenant's jobs are running, as many as this server runs at once "
                    "(EFT_EXPORTS_PER_TENANT): ask again when one has finished (GET /jobs/{id}/exports)",
                    "kind", self.settings.quota_retry_after_s)
            self.store.insert_event(conn, job.id, exports.STARTED, f"{kind} export {export_id} started", data={
                "export_id": export_id, "kind": kind, "path": path, "hub_repo": hub_repo,
                "ray_submission_id": submission_id})
        memory = exports.memory_needed((job.config or {}).get("model_path"), kind)
        try:
            self.launcher.submit_export(job.id, export_id, kind, hub_repo, hub_private, memory=memory)
        except Exception as exc:
            self.store.append_event(job.id, exports.FAILED, f"{kind} export could not start: {exc}",
                                    data={"export_id": export_id, "kind": kind}, level="error")
            raise
        return next(e for e in self.exports(job.id, tenant) if e["id"] == export_id), True

    def fine_tuned_models(self, tenant: str | None) -> list[JobRecord]:
        """The succeeded jobs of `tenant` (None: every tenant's), newest first: the models they
        trained, as `/v1/models` lists them."""
        found: list[JobRecord] = []
        after = None
        while True:
            page, has_more = self.store.list_jobs(tenant=tenant, limit=100, after=after,
                                                  statuses=[JobStatus.succeeded])
            found += [j for j in page if j.artifact_path]
            if not has_more or not page:
                return found
            after = page[-1].id

    def serving_target(self, model: str, tenant: str | None) -> tuple[BaseSource, AdapterSource | None, str]:
        """What a model server loads to answer with `model`: the base model, the adapter (None
        for a base model itself), and how the job rendered a system message ("keep" or
        "fold"). A base model is one under the allowed model roots; a fine-tuned one must be
        this tenant's (ModelNotFound otherwise). Raises Conflict for a full fine-tuning job's
        model, which is a whole model rather than an adapter."""
        path = resolve_under_roots(model, self.settings.allowed_model_roots)
        if path is not None and (path / "config.json").is_file() and not model.startswith("ft:"):
            return BaseSource(str(path)), None, "keep"
        job, checkpoint = self.resolve_model(model, tenant)
        config = job.config or {}
        if config.get("method", (job.request.get("method") or {}).get("type")) == "full":
            raise Conflict(f"{model} was trained by full fine-tuning: it is a whole model, not an adapter "
                           "on its base; download it (GET /jobs/{id}/artifacts) and serve it as a base model",
                           code="model_not_servable", param="model")
        base = BaseSource(config.get("model_path") or job.request["model"], config.get("hub"))
        if checkpoint is None:
            return base, AdapterSource(model, job.artifact_path or "", "artifact"), config.get("system_message", "keep")
        return base, AdapterSource(model, checkpoint["path"], "checkpoint"), config.get("system_message", "keep")

    def resolve_model(self, model: str, tenant: str | None) -> tuple[JobRecord, dict[str, Any] | None]:
        """The job behind a fine-tuned model id, and the checkpoint it names (None: the model
        the job published). Raises ModelNotFound for an id that is not exactly one of this
        tenant's: another tenant's model, a job that has not succeeded (for the published
        model), a checkpoint never saved or pruned since, an id with another base or name."""
        ref = parse_model_id(model)
        if ref is None:
            raise ModelNotFound(model)
        try:
            job = self.store.get_job(ref.job_id, tenant)
        except JobNotFound:
            raise ModelNotFound(model) from None
        if ref.step is None:
            if model != model_id(job) or job.status is not JobStatus.succeeded or not job.artifact_path:
                raise ModelNotFound(model)
            return job, None
        for checkpoint in self._checkpoints_of(job):
            if checkpoint["model"] == model and checkpoint["available"]:
                return job, checkpoint
        raise ModelNotFound(model)
