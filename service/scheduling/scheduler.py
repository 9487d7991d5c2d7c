"""The scheduler: validates new jobs, dispatches queued ones, and reconciles with Ray.

`tick()` is one pass; `run_forever` repeats it in a background thread of each service replica,
every `EFT_SCHEDULER_INTERVAL_S` and at once when `wake()` says a job was created here. Asking
Ray for the state of every running job costs a dashboard request each, so that part runs only
every `EFT_RECONCILE_INTERVAL_S` (drivers record their own outcomes; this pass catches drivers
that died). Every step is safe to run from several replicas at once: each status change is
a compare-and-set in the store, so a job is claimed (and its attempt number taken) by exactly
one replica, and a lost race is simply skipped. The claim checks the cluster's and the
tenant's running limits in the same serialized transaction, and records the Ray submission
id, so a replica may die at any line of a dispatch and the job is still settled exactly once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

from eft.types.jobs import JobStatus
from eft.service import metrics
from eft.service.scheduling import capacity
from eft.service.scheduling import estimates
from eft.service.scheduling import queueing
from eft.service.errors import Conflict, RequestInvalid
from eft.service.runs.launcher import Launcher, RayJobState, stop_quietly, submission_id_for
from eft.service.jobs.lifecycle import IllegalTransition
from eft.service.settings import Settings
from eft.service.store.store import JobRecord, Store, utcnow
from eft.training.config import TrainConfig

log = logging.getLogger("eft.scheduler")

Validator = Callable[[JobRecord, Settings], tuple[Any, dict[str, Any]]]
Capacity = Callable[[], "list[capacity.Node] | None"]
ACTIVE = queueing.ACTIVE
MAX_DISPATCH_FAILURES = 3
MAX_VALIDATION_FAILURES = 3


class Scheduler:
    def __init__(self, store: Store, launcher: Launcher, settings: Settings, validate: Validator,
                 nodes: Capacity | None = None):
        self.store, self.launcher, self.settings, self.validate = store, launcher, settings, validate
        #: The cluster's nodes now (Ray's, by default); None from it: capacity unknown this pass.
        self.nodes = nodes or (lambda: capacity.snapshot(self.settings))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._validation_failures: Counter[str] = Counter()

    def tick(self, reconcile: bool = True) -> None:
        """One pass. Cancelling jobs are reconciled on every pass (a cancel should be prompt);
        running ones only when `reconcile`."""
        phases = (self.validate_pending, self.dispatch_queued, lambda: self.reconcile(running=reconcile))
        for name, phase in zip(("validate_pending", "dispatch_queued", "reconcile"), phases):
            try:
                phase()
            except Exception:  # noqa: BLE001 - one bad pass must not kill the loop
                log.exception("scheduler phase %s failed", name)

    def run_forever(self) -> None:
        last_reconcile = float("-inf")
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            due = now - last_reconcile >= self.settings.reconcile_interval_s
            self.tick(reconcile=due)
            if due:
                last_reconcile = now
            self._wake.wait(self.settings.scheduler_interval_s)

    def wake(self) -> None:
        """Run the next pass now (a job was created): a new job need not wait out the interval."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # --- validating -> queued | failed -----------------------------------------------------

    def validate_pending(self) -> None:
        pending, _ = self.store.list_jobs(statuses=[JobStatus.validating], oldest_first=True, limit=20)
        for job in pending:
            self._validate_one(job)

    def _validate_one(self, job: JobRecord) -> None:
        started = time.perf_counter()
        outcome = self._validate_and_move(job)
        metrics.VALIDATION_SECONDS.labels(outcome).observe(time.perf_counter() - started)

    def _validate_and_move(self, job: JobRecord) -> str:
        """Validate one job and move it on. Returns "queued" or "failed"."""
        from eft.training.errors import TrainingUserError

        try:
            config, stats = self.validate(job, self.settings)
        except TrainingUserError as exc:
            self._safe_transition(job, JobStatus.failed, exc.message, error_code=exc.code,
                                  error_message=exc.message, error_param=exc.param)
            return "failed"
        except RequestInvalid as exc:
            first = exc.problems[0]
            self._safe_transition(job, JobStatus.failed, first.message, error_code=f"user_error.{first.code}",
                                  error_message=first.message, error_param=first.param)
            return "failed"
        except Exception as exc:  # noqa: BLE001 - one job's failure never stops the others'
            # A platform problem (a file system hiccup, a crash in a library): retried on the
            # next passes a bounded number of times, then the job fails with the reason.
            self._validation_failures[job.id] += 1
            log.exception("validating job %s failed", job.id)
            if self._validation_failures[job.id] < MAX_VALIDATION_FAILURES:
                return "retry"
            del self._validation_failures[job.id]
            message = f"validation failed {MAX_VALIDATION_FAILURES} times: {type(exc).__name__}: {exc}"
            self._safe_transition(job, JobStatus.failed, message, error_code="platform_error.validation_failed",
                                  error_message=message[:2000])
            return "failed"
        self._validation_failures.pop(job.id, None)
        dropped = stats.get("dropped_examples", 0)
        note = f" ({dropped} left out: no trained token within max_seq_len)" if dropped else ""
        try:
            estimate = estimates.estimate(self.store, config, stats, self.settings)
        except Exception:  # noqa: BLE001 - an estimate is a courtesy: the job goes on without one
            log.exception("estimating job %s failed", job.id)
            estimate = None
        self._safe_transition(
            job, JobStatus.queued, f"validated: {stats['train_examples']} training examples{note}, "
            f"{config.total_steps} steps", data=stats, config=config.to_dict(),
            total_steps=config.total_steps, estimate=estimate,
        )
        return "queued"

    # --- queued -> running -----------------------------------------------------------------

    def dispatch_queued(self) -> None:
        """Start queued jobs while the cluster and their tenants are under their limits, in the
        fair order (`eft.service.scheduling.queueing`): the next free slot goes to the tenant furthest
        below its weighted share, within a tenant to its highest-priority, then oldest, job; a
        tenant with a long backlog never hides another tenant's job from a free slot.

        With the cluster's capacity known (`EFT_SCHEDULING=elastic`, the default), the elastic
        policy decides as well: a queued job starts only when its minimum workers can be placed
        (now, or once the autoscaler has grown a group), running elastic jobs are sized across
        the cluster (their drivers keep to the size: a resize checkpoints first, so no step is
        lost), a lower-priority job is paused when a minimum cannot fit otherwise and resumed
        when room frees."""
        if self.settings.dispatch_paused:
            return  # validated jobs wait in the queue until dispatching resumes
        cluster = queueing.cluster_plan(self.store, self.settings, self.nodes())
        if cluster is not None:
            self._apply_to_running(cluster)
        line = queueing.queue(self.store, self.settings)
        running = line.running
        capacity_left = self.settings.max_running_jobs - sum(running.values())
        per_tenant = self.settings.max_running_jobs_per_tenant
        chosen: list[str] = []
        for job_id in line.order:
            if len(chosen) >= capacity_left:
                break
            tenant = line.tenant_of[job_id]
            if running[tenant] >= per_tenant:
                continue
            if cluster is not None and not (job_id in cluster.decisions and cluster.decisions[job_id].runs):
                continue  # its minimum does not fit: it waits, and others may start before it
            if cluster is not None and not cluster.take(job_id):
                continue  # room is being made for it (a job shrinks or pauses): it starts once it is free
            chosen.append(job_id)
            running[tenant] += 1
        for job in self.store.get_jobs(chosen):
            if job.status is JobStatus.queued:
                if cluster is not None:
                    decision = cluster.decisions[job.id]
                    # A GPU job is pinned to the GPU type its minimum was placed on.
                    gpu_type = cluster.picture.gpu_type_of(decision.placement) if cluster.shapes[job.id].gpu else None
                    self._record_decision(job, decision, announce=False, gpu_type=gpu_type)
                self._dispatch_one(job)

    def _apply_to_running(self, cluster: queueing.ClusterPlan) -> None:
        """Carry the policy's sizes to running jobs (a new target is the job's `schedule`, which
        its driver reads), pause the ones it pauses and queue again the scheduler-paused ones it
        gives room to."""
        starting = {i for i, d in cluster.decisions.items() if d.runs and cluster.jobs[i].status is not JobStatus.running}
        for job_id, decision in cluster.decisions.items():
            job = cluster.jobs[job_id]
            if queueing.scheduler_paused(job):
                if decision.runs:
                    self._safe_transition(job, JobStatus.queued, f"room freed: resumed by the scheduler at step "
                                          f"{job.step}", event_type="resume_requested",
                                          data={"step": job.step, "by": "scheduler"})
                continue
            if job.status is not JobStatus.running:
                continue
            if not decision.runs:
                # Paused only for a job that starts in this very plan: never on a guess.
                if decision.because_of in starting:
                    self._pause_for(job, decision)
                continue
            shape = cluster.shapes[job_id]
            if shape.min_workers < shape.max_workers:
                self._record_decision(job, decision, announce=True, gpu_type=shape.gpu_type)

    def _record_decision(self, job: JobRecord, decision: Any, announce: bool, gpu_type: str | None = None) -> None:
        schedule = {"workers": decision.workers, "reason": decision.reason, "because_of": decision.because_of,
                    "placement": dict(decision.placement)}
        if gpu_type:
            schedule["accelerator_type"] = gpu_type
        previous = job.schedule or {}
        if previous.get("workers") == decision.workers and previous.get("accelerator_type") == schedule.get("accelerator_type"):
            return
        if not self.store.set_schedule(job.id, schedule, statuses=(JobStatus.queued, JobStatus.running)):
            return
        if announce and decision.workers != (job.num_workers or previous.get("workers")):
            because = f" (room for {decision.because_of})" if decision.because_of else ""
            self.store.append_event(job.id, "scheduled", f"the scheduler sizes it to {decision.workers} worker(s): "
                                    f"{decision.reason}{because}", data=schedule, attempt=job.attempt)

    def _pause_for(self, job: JobRecord, decision: Any) -> None:
        schedule = {"workers": 0, "paused": True, "reason": decision.reason, "because_of": decision.because_of}
        moved = self._safe_transition(job, JobStatus.pausing, f"paused by the scheduler to make room for "
                                      f"{decision.because_of}: {decision.reason}; it resumes when room frees",
                                      data={"by": "scheduler", "because_of": decision.because_of})
        if moved is not None:
            self.store.set_schedule(job.id, schedule)

    def _dispatch_one(self, job: JobRecord) -> bool:
        """Claim the job's next attempt and submit it. The claim records the attempt's
        submission id (derived from the job id and attempt) before anything is submitted, so a
        replica dying at any line leaves a job that reconcile can settle: its Ray Job exists
        and is watched, or it does not and the job is queued again after a grace period."""
        attempt = job.attempt + 1
        submission_id = submission_id_for(job.id, attempt)
        claimed = self.store.claim(
            job, submission_id=submission_id, max_running=self.settings.max_running_jobs,
            max_per_tenant=self.settings.max_running_jobs_per_tenant, active=ACTIVE,
            message=f"dispatching attempt {attempt}", started_at=job.started_at or utcnow(),
        )
        if claimed is None:
            # Lost to another writer, or a limit was reached, or this replica's own claim
            # committed while its connection dropped (the retried claim then misses): in that
            # last case the attempt is ours to submit, and submitting it twice is harmless.
            claimed = self.store.get_job(job.id)
            if not (claimed.status is JobStatus.running and claimed.attempt == attempt
                    and claimed.submission_id == submission_id):
                return False
        else:
            metrics.QUEUE_WAIT_SECONDS.observe(max(0.0, (claimed.updated_at - job.updated_at).total_seconds()))
        started = time.perf_counter()
        try:
            submitted = self.launcher.submit(job.id, attempt, job.name)
        except Exception as exc:  # noqa: BLE001 - Ray unreachable, refused, ...
            metrics.DISPATCH_SECONDS.labels("failed").observe(time.perf_counter() - started)
            log.warning("dispatch of %s attempt %s failed: %s", job.id, attempt, exc)
            self._after_dispatch_failure(claimed, exc)
            return False
        metrics.DISPATCH_SECONDS.labels("submitted").observe(time.perf_counter() - started)
        if submitted:
            self.store.append_event(job.id, "submitted", f"Ray Job {submission_id} submitted",
                                    data={"submission_id": submission_id}, attempt=attempt)
        now = self.store.get_job(job.id)
        if now.attempt != attempt or now.status is not JobStatus.running:
            # Cancelled or requeued while the submit was in flight: stop what was started.
            stop_quietly(self.launcher, submission_id)
        return True

    def _after_dispatch_failure(self, job: JobRecord, exc: Exception) -> None:
        # The failed submit may have reached Ray after all (a timeout): stop it before the job
        # moves on, so no attempt runs unwatched.
        stop_quietly(self.launcher, submission_id_for(job.id, job.attempt))
        failures = job.attempt  # every dispatch, failed or not, used up one attempt
        if failures >= MAX_DISPATCH_FAILURES:
            self._safe_transition(
                job, JobStatus.failed, f"could not start on Ray: {exc}",
                error_code="platform_error.dispatch_failed",
                error_message=f"the Ray cluster refused the job {failures} times: {exc}; check "
                "that the cluster and its dashboard are up, then resubmit",
            )
        else:
            self._safe_transition(job, JobStatus.queued, f"dispatch failed, will retry: {exc}",
                                  event_type="dispatch_failed", data={"error": str(exc)})

    # --- running | cancelling -> terminal ----------------------------------------------------

    def reconcile(self, running: bool = True) -> None:
        statuses = ACTIVE if running else (JobStatus.cancelling,)
        active, _ = self.store.list_jobs(statuses=statuses, limit=10_000)
        for job in active:
            # Every claim records its submission id; a job claimed by an older release has none.
            submission_id = job.submission_id or submission_id_for(job.id, job.attempt)
            if job.status is JobStatus.cancelling:
                self.launcher.stop(submission_id)
            state = self.launcher.state(submission_id)
            if state == RayJobState.MISSING and job.status is JobStatus.running and (
                    utcnow() - job.updated_at).total_seconds() < self.settings.dispatch_grace_s:
                continue  # claimed a moment ago: its submit may still be on its way
            if state in RayJobState.TERMINAL:
                self._settle(self.store.get_job(job.id), state)

    def _settle(self, job: JobRecord, ray_state: str) -> None:
        """A job whose Ray Job ended without the driver recording an outcome: the driver died
        (its node was lost, it was killed) or Ray forgot it (the head restarted). Within the
        job's restart budget it goes back to the queue, and its next attempt resumes from the
        latest checkpoint (the run name is the job id); past the budget it fails."""
        if job.status is JobStatus.cancelling:
            self._safe_transition(job, JobStatus.cancelled, "stopped on request",
                                  data={"ray_state": ray_state})
            return
        if job.status is JobStatus.pausing:
            # Whatever it had saved is where it resumes: its latest checkpoint.
            self._safe_transition(job, JobStatus.paused, f"the driver ended (Ray Job {ray_state}) while "
                                  "pausing; a resume continues from the latest checkpoint",
                                  data={"ray_state": ray_state, "step": job.step})
            return
        if job.status is not JobStatus.running:
            return
        # Whatever Ray still has of this attempt is stopped first: a Ray Job that reappears (a
        # submit that was still on its way) must not run beside the next attempt.
        stop_quietly(self.launcher, job.submission_id or submission_id_for(job.id, job.attempt))
        budget = int((job.config or {}).get("max_restarts", TrainConfig.max_restarts))
        if job.restarts < budget:
            requeued = self._safe_transition(
                job, JobStatus.queued,
                f"the driver of attempt {job.attempt} is gone (Ray Job {ray_state}); queued again "
                "to resume from the latest checkpoint", event_type="restarted",
                data={"reason": "driver_lost", "ray_state": ray_state, "attempt": job.attempt},
            )
            if requeued is not None:
                self.store.add_counts(job.id, restarts=1)
            return
        tail = self.launcher.logs(job.submission_id or "")[-2000:]
        message = (f"the job's Ray Job ended as {ray_state} without recording a result, "
                   f"after {job.restarts} restart(s); see its logs in the Ray dashboard or "
                   "GET /jobs/{id}/events")
        self._safe_transition(job, JobStatus.failed, message, error_code="platform_error.driver_exited",
                              error_message=f"{message}\n{tail}".strip(), data={"ray_state": ray_state})

    def _safe_transition(self, job: JobRecord, target: JobStatus, message: str, **kw: Any) -> JobRecord | None:
        """Apply a transition from the status this pass saw `job` in; returns None when another
        writer (another replica's scheduler, a cancel) moved the job first."""
        try:
            return self.store.transition(job.id, target, message, expected_status=job.status, **kw)
        except (Conflict, IllegalTransition) as exc:
            log.info("skipped %s -> %s for %s: %s", job.status.value, target.value, job.id, exc)
            return None
