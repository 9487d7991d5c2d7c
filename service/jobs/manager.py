"""The job manager: the one home of the rules of a job, behind every route (`/jobs` and `/v1`).

Route functions in `api/routes/` stay small and call these once; everything here works on the
store and the launcher, and returns wire models. Creating a job is one call, `JobService.create`:
tenant checks on file ids, quotas, the request's checks and its plan, and replay of a repeated
`Idempotency-Key`, in that order.
"""

from __future__ import annotations

import json
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
from eft.service.accounts.auth import KeyStore, Principal
from eft.service.errors import Conflict, JobNotFound, Problem, RequestInvalid, ServiceError
from eft.service.requests.files import check_job_files
from eft.service.files.store import FileStore
from eft.service.accounts.idempotency import Idempotency, request_digest
from eft.service.serving.model_ids import parse_model_id
from eft.service.scheduling import queueing
from eft.service.runs.launcher import Launcher, stop_quietly
from eft.service.jobs.exports import Exports
from eft.service.jobs.models import Models, checkpoints_of
from eft.service.jobs.wire import to_wire
from eft.service.webhooks.endpoints import WebhookEndpoints
from eft.service.accounts.quotas import check_priority, check_quota, demand
from eft.service.settings import Settings
from eft.service.store.store import JobRecord, Store
from eft.service import metrics
from eft.service.files import results as result_files
from eft.service.files.store import FileNotFound, FileRecord
from eft.service.requests.check import check_raw_inputs, check_request
from eft.service.requests.files import owned_inputs, validate_upload
from eft.service.requests.plan import spec_for_request
from eft.service.runs.logs import JobLogs
from eft.service.serving.downloads import location_of
from eft.planner import plan
from eft.training import storage
from eft.training.artifacts import MANIFEST
from eft.types.files import DatasetReport, ValidateRequest
from eft.types.plans import PlanRequest
from eft.types.text import decimal_int

log = logging.getLogger("eft.jobs")


#: Reads and writes a cancel makes before it gives up on a job that keeps changing status.
CANCEL_TRIES = 5


class JobService:
    def __init__(self, store: Store, launcher: Launcher, settings: Settings,
                 on_created: Callable[[], None] | None = None,
                 files: FileStore | None = None, idempotency: Idempotency | None = None):
        self.store, self.launcher, self.settings = store, launcher, settings
        #: Called after a job is stored (the replica's scheduler wakes to validate it).
        self.on_created = on_created
        self.files = files or FileStore(store.engine, settings)
        self.idempotency = idempotency or Idempotency(store.engine)
        #: What routes ask of the rooms next to jobs, each behind its own small facade.
        self.keys = KeyStore(store.engine, settings.admin_api_key, settings.admin_tenant)
        self.exports = Exports(store, launcher, settings)
        self.models = Models(store, settings)
        self.webhooks = WebhookEndpoints(store, settings)
        self.logs = JobLogs(store, launcher)
        #: The dispatch order and cluster plan queued jobs' reads share (service/scheduling/queueing.py).
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
        kept = [c for c in checkpoints_of(self.store, job) if c["available"]]
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
        if req.webhook_url:
            self.webhooks.check_job_url(req.webhook_url, tenant)

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
        return checkpoints_of(self.store, self.store.get_job(job_id, tenant))

    # --- what else a job's routes read -----------------------------------------------------

    def owner(self, job_id: str, tenant: str | None) -> str:
        """The tenant that owns the job (an admin's `tenant` None sees every one). Raises JobNotFound."""
        return self.store.get_job(job_id, tenant).tenant

    def manifest(self, job_id: str, tenant: str | None) -> dict[str, Any]:
        """The `eft_manifest.json` of the job's artifact, read from wherever the artifact is (a
        directory or an object store). Raises Conflict until the job has written its artifact."""
        job = self.store.get_job(job_id, tenant)
        text = None
        if job.artifact_path:
            place = storage.resolve(job.artifact_path).child(MANIFEST)
            text = storage.read_text(place.filesystem, place.path)
        if text is None:
            raise Conflict(f"job {job_id} is {job.status.value} and has no artifact yet; the manifest "
                           "is written when it succeeds", code="manifest_not_available", param="job_id")
        return json.loads(text)

    def artifact_location(self, job_id: str, tenant: str | None, checkpoint: int | None = None,
                          export: str | None = None) -> str:
        """Where the files to download are: the job's published artifact, a kept checkpoint's,
        or a finished export's. Raises Conflict before they exist, JobNotFound, CheckpointNotFound."""
        if export is not None:
            if checkpoint is not None:
                raise ServiceError("give either checkpoint or export, not both", param="export",
                                   code="invalid_parameters")
            return self.exports.location(job_id, tenant, export)
        job = self.store.get_job(job_id, tenant)
        return location_of(job, self.store.list_checkpoints(job.id) if checkpoint is not None else [], checkpoint)

    def file(self, file_id: str, tenant: str | None) -> FileRecord:
        """An uploaded file of `tenant`'s, or a succeeded job's result file (written the first
        time it is asked for). Raises FileNotFound."""
        try:
            return self.files.get(file_id, tenant)
        except FileNotFound:
            job_id = result_files.job_of(file_id)
            if job_id is None:
                raise
            try:
                job = self.store.get_job(job_id, tenant)
            except JobNotFound:
                raise FileNotFound(file_id) from None
            return result_files.ensure(self.files, self.store, job)

    def validate_file(self, file_id: str, tenant: str | None, request: ValidateRequest) -> DatasetReport:
        """The full report on one of `tenant`'s files (no job made): errors by line and field,
        warnings, and with a model its token counts. Raises FileNotFound, RequestInvalid."""
        return validate_upload(self.files, self.files.get(file_id, tenant), request, tenant, self.settings)

    def validate_grader(self, grader: dict[str, Any]) -> dict[str, Any]:
        from eft.service.requests import graders

        return graders.validate(grader)

    def grader_judge_requests(self, grader: dict[str, Any], model_sample: str, item: Any) -> list[dict[str, Any]]:
        from eft.service.requests import graders

        return graders.judge_requests(grader, model_sample, item)

    def run_grader(self, grader: dict[str, Any], model_sample: str, item: Any, replies: dict[str, str]) -> dict[str, Any]:
        from eft.service.requests import graders

        return graders.run(grader, model_sample, item, replies)

    def plan(self, request: PlanRequest) -> dict[str, Any]:
        """Every candidate configuration of `request` on its cluster, with its memory and
        reason, and the chosen one. Raises RequestInvalid for a model it cannot resolve."""
        return plan(spec_for_request(request, request.cluster, self.settings)).to_dict()

    def raw_body_problems(self, body: dict[str, Any], scope: str | None) -> list[Problem]:
        """For a job body that failed its schema: the problems with the files and model it names
        too (only files `scope` owns are read), so that one 422 lists every problem."""
        body, problems = owned_inputs(body, scope, self.files)
        return problems + check_raw_inputs(body, self.settings)

    def ping(self) -> bool:
        """Whether the job store answers."""
        return self.store.ping()

    def prometheus(self) -> str:
        """The service's metrics in Prometheus' text format."""
        return metrics.render(self.store)
