"""The Ray Job entrypoint of one job attempt: runs a TorchTrainer and records the outcome.

Run by the service's launcher as
    python -m training.driver --job-id ftjob-... --attempt N
with the service's `EFT_*` settings in the environment. The driver and the Train controller
write progress, checkpoints and the final status straight into the job store, every write
fenced by the attempt number so a stale attempt can never overwrite a newer one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from api.models import JobStatus
from service.errors import Conflict
from service.settings import get_settings
from service.store import Store
from training import artifacts
from training.config import TrainConfig
from training.errors import find_user_error
from training.loop import train_loop_per_worker
from training.progress import ProgressSink

log = logging.getLogger("eft.driver")


class StoreCheckpoints(ray.train.UserCallback):
    """Records every checkpoint Ray Train has persisted. Runs in the Train controller, so the
    store is opened lazily there rather than pickled. (Per-step metrics take another path:
    training/progress.py.)"""

    def __init__(self, database_url: str, job_id: str, attempt: int):
        self.database_url, self.job_id, self.attempt = database_url, job_id, attempt
        self._store: Store | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.database_url)
        return self._store

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:  # noqa: ANN001
        values = {k: float(v) for k, v in metrics[0].items() if isinstance(v, (int, float))}
        step = int(values.get("step", 0))
        if checkpoint is not None:
            self.store.record_checkpoint(self.job_id, self.attempt, step, checkpoint.path, values)
            self.store.append_event(
                self.job_id, "checkpoint_saved", f"checkpoint saved at step {step}",
                data={"step": step, "path": checkpoint.path}, attempt=self.attempt,
            )


def build_trainer(cfg: TrainConfig, callback: StoreCheckpoints, sink: Any) -> TorchTrainer:
    workers: int | tuple[int, int] = (
        cfg.min_workers if cfg.min_workers == cfg.max_workers else (cfg.min_workers, cfg.max_workers)
    )
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg.to_dict(), "progress": sink},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=cfg.use_gpu,
            resources_per_worker={"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})},
        ),
        run_config=RunConfig(
            # Reusing the job id as the run name makes a re-dispatched attempt resume from
            # the latest checkpoint of the previous one.
            name=cfg.job_id,
            storage_path=cfg.checkpoint_root,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint_keep),
            failure_config=FailureConfig(max_failures=0),
            callbacks=[callback],
        ),
    )


def _fail(store: Store, job_id: str, attempt: int, exc: BaseException) -> None:
    user_error = find_user_error(exc)
    if user_error is None and hasattr(exc, "worker_failures"):
        for failure in exc.worker_failures.values():
            user_error = user_error or find_user_error(failure)
    if user_error is not None:
        code, message, param = user_error.code, user_error.message, user_error.param
    else:
        code, message, param = "platform_error.training_failed", f"{type(exc).__name__}: {exc}", None
    store.transition(
        job_id, JobStatus.failed, message[:2000], expected_attempt=attempt,
        error_code=code, error_message=message[:8000], error_param=param,
    )


def run(job_id: str, attempt: int) -> int:
    """Run one attempt of a job. Returns the process exit code."""
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    job = store.get_job(job_id)
    if job.attempt != attempt or job.status not in (JobStatus.running, JobStatus.cancelling):
        log.warning("job %s is %s on attempt %s; attempt %s exits", job_id, job.status, job.attempt, attempt)
        return 0
    cfg = TrainConfig.from_dict(job.config or {})
    store.append_event(
        job_id, "training_started", f"attempt {attempt} starting with {cfg.min_workers}-{cfg.max_workers} workers",
        data={"min_workers": cfg.min_workers, "max_workers": cfg.max_workers}, attempt=attempt,
    )
    sink = ProgressSink.remote(settings.resolved_database_url, job_id, attempt)
    trainer = build_trainer(cfg, StoreCheckpoints(settings.resolved_database_url, job_id, attempt), sink)
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - every failure becomes data on the job
        log.exception("job %s attempt %s failed", job_id, attempt)
        _fail(store, job_id, attempt, exc)
        return 1
    final_metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    with result.checkpoint.as_directory() as directory:
        manifest = artifacts.build_manifest(cfg, final_metrics, attempt)
        path = artifacts.publish(
            Path(directory) / "adapter", Path(cfg.artifact_root) / job_id, manifest
        )
    try:
        store.transition(
            job_id, JobStatus.succeeded, f"adapter written to {path}", expected_attempt=attempt,
            artifact_path=str(path), result_metrics=final_metrics, step=cfg.total_steps,
            data={"artifact_path": str(path), **final_metrics},
        )
    except Conflict:
        log.warning("job %s moved on while attempt %s finished", job_id, attempt)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return run(args.job_id, args.attempt)


if __name__ == "__main__":
    sys.exit(main())
