"""The service's side of training's reporter protocol (training/reporting.py): every report of
one job attempt becomes a write to the job store, fenced by the attempt.

The reporter is pickled into the Train controller and into rank 0's progress actor; each of
those processes opens its own store connection on first use.
"""

from __future__ import annotations

import logging
from typing import Any

from eft.service.errors import Conflict
from eft.service.store.store import Store
from eft.types.jobs import JobStatus

log = logging.getLogger("eft.reporter")


class StoreReporter:
    def __init__(self, database_url: str, job_id: str, attempt: int, store: Store | None = None):
        """`store`: an open store of this process to share (the entrypoint's); a process the
        reporter is pickled into opens its own."""
        self.database_url, self.job_id, self.attempt = database_url, job_id, attempt
        self._store = store
        self._spot: bool | None = None  # whether its workers are on spot nodes (its estimate says)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.database_url, migrate=False)
        return self._store

    def position(self) -> tuple[int, float]:
        latest = self.store.latest_metric_values([self.job_id]).get(self.job_id, {})
        return self.store.get_job(self.job_id).step, float(latest.get("trained_tokens", 0.0))

    def started(self, min_workers: int, max_workers: int) -> None:
        self.event("training_started", f"attempt {self.attempt} starting with {min_workers}-{max_workers} workers",
                   {"min_workers": min_workers, "max_workers": max_workers})

    def step(self, step: int, num_workers: int | None, worker_seconds: float = 0.0) -> bool:
        extra: dict[str, Any] = {"num_workers": num_workers} if num_workers else {}
        if worker_seconds > 0:
            extra.update(self._usage_values(worker_seconds))
        return bool(self.store.update_job(self.job_id, attempt=self.attempt, step=step, **extra))

    def _usage_values(self, worker_seconds: float) -> dict[str, Any]:
        from eft.service.store.schema import jobs

        if self._spot is None:
            self._spot = bool((self.store.get_job(self.job_id).estimate or {}).get("spot"))
        values: dict[str, Any] = {"worker_seconds": jobs.c.worker_seconds + worker_seconds}
        if self._spot:
            values["spot_worker_seconds"] = jobs.c.spot_worker_seconds + worker_seconds
        return values

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.store.record_metrics(self.job_id, self.attempt, step, values)

    def resumed(self, step: int, world_size: int) -> bool:
        return bool(self.store.update_job(self.job_id, attempt=self.attempt, step=step, num_workers=world_size))

    def checkpoint(self, step: int, path: str, values: dict[str, float], *, world_size: int | None,
                   reason: str, size_bytes: int | None, save_seconds: float | None) -> None:
        self.store.record_checkpoint(self.job_id, self.attempt, step, path, values, world_size=world_size,
                                     reason=reason, size_bytes=size_bytes, save_seconds=save_seconds)

    def event(self, type_: str, message: str, data: dict[str, Any], level: str = "info") -> None:
        self.store.append_event(self.job_id, type_, message, data=data, level=level, attempt=self.attempt)

    def counts(self, **deltas: int) -> None:
        self.store.add_counts(self.job_id, attempt=self.attempt, **deltas)

    def pause_requested(self) -> bool:
        job = self.store.get_job(self.job_id)
        return job.status is JobStatus.pausing and job.attempt == self.attempt

    def usage(self, worker_seconds: float) -> None:
        self.store.update_job(self.job_id, attempt=self.attempt, **self._usage_values(worker_seconds))

    def worker_limit(self) -> dict[str, Any] | None:
        job = self.store.get_job(self.job_id)
        schedule = job.schedule or {}
        if job.attempt != self.attempt or not schedule.get("workers"):
            return None
        return {k: schedule.get(k) for k in ("workers", "reason", "because_of")}

    def paused(self, step: int) -> bool:
        try:
            self.store.transition(self.job_id, JobStatus.paused, f"paused at step {step}: the workers "
                                  "checkpointed and stopped; POST /jobs/{id}/resume continues from there",
                                  expected_attempt=self.attempt, expected_status=JobStatus.pausing, step=step,
                                  data={"step": step})
        except Conflict:
            return False
        return True

    def succeeded(self, artifact_path: str, metrics: dict[str, float], step: int) -> bool:
        try:
            self.store.transition(
                self.job_id, JobStatus.succeeded, f"adapter written to {artifact_path}",
                expected_attempt=self.attempt, artifact_path=artifact_path, result_metrics=metrics,
                step=step, data={"artifact_path": artifact_path, **metrics},
            )
        except Conflict:
            return False
        self._write_result_file()
        return True

    def _write_result_file(self) -> None:
        """The job's step metrics as its result file (`result_files` on /v1); a failure here
        leaves the job succeeded (the file is written when first read instead)."""
        from eft.service.files import results as result_files
        from eft.service.files.store import FileStore
        from eft.service.settings import get_settings

        try:
            result_files.ensure(FileStore(self.store.engine, get_settings()), self.store,
                                self.store.get_job(self.job_id))
        except Exception:  # noqa: BLE001 - logged; nothing of the job depends on it
            log.exception("could not write the result file of %s", self.job_id)

    def failed(self, code: str, message: str, param: str | None) -> None:
        self.store.transition(
            self.job_id, JobStatus.failed, message[:2000], expected_attempt=self.attempt,
            error_code=code, error_message=message[:8000], error_param=param,
        )
