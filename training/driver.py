"""One job attempt in its Ray Job driver: runs a TorchTrainer and reports the outcome.

Ray Train supplies the recovery machinery (restarts from the latest checkpoint, elastic
resizes, preemption notices); the driver adds the job's policy and bookkeeping through the
extension points Ray Train's controller offers: a failure policy that never retries user
errors, and callbacks in `RunConfig(callbacks=...)` that report checkpoints and the
controller's state changes (restarted, resized, preempted).

Started by the service's Ray Job entrypoint (service/runs/entrypoint.py), which hands `run` the
job's plain `TrainConfig`, a `RunSpec` and a `Reporter` (training/reporting.py): everything the
driver, the Train controller and rank 0 tell the outside world goes through that reporter.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from eft.training._ray import (
    ENABLE_PREEMPTION_WATCHER_ENV_VAR,
    DatasetsCallback,
    ElasticScalingPolicy,
    PlacementGroupCleanerCallback,
)
from eft.training import storage
from eft.training import artifacts
from eft.training.config import TrainConfig
from eft.training.errors import find_user_error
from eft.training.controller import (WATCH_PREEMPTIONS, InControllerPreemptionWatch, JobFailurePolicy, LosslessResize,
                                     RecordCheckpoints, RecordRecovery)
from eft.training.loop import train_loop_per_worker
from eft.training.progress import ProgressSink
from eft.training.reporting import Reporter, RunSpec
from eft.training.trackers import with_tensorboard

log = logging.getLogger("eft.driver")


class JobTrainer(TorchTrainer):
    """A TorchTrainer whose controller uses `JobFailurePolicy` and starts no helper process
    the job has no use for. Every idle Ray process costs about 1% of a core (its 10 ms signal
    check), taken from the workers where they share a node, so three of Ray Train's default
    helpers are left out or moved:
    - the dataset manager: the loop reads its data itself (training/data.py), not through the
      `datasets` Ray Data would shard;
    - the detached placement-group cleaner, which asks for the controller every second to
      remove the workers' placement group should the controller die unannounced: the
      controller belongs to the attempt's Ray Job, and Ray removes a job's placement groups
      when the job ends, however it ends;
    - the preemption watcher's actor: the same watcher runs as a thread of the controller
      (`InControllerPreemptionWatch`)."""

    def _create_default_callbacks(self) -> list[Any]:
        unused = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
        return [cb for cb in super()._create_default_callbacks() if not isinstance(cb, unused)]

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any):  # noqa: ANN202
        policy = JobFailurePolicy(self.run_config.failure_config)
        controller_init_kwargs["failure_policy"] = policy
        if isinstance(controller_init_kwargs.get("scaling_policy"), ElasticScalingPolicy):
            config = self.train_loop_config or {}
            controller_init_kwargs["scaling_policy"] = LosslessResize(
                self.scaling_config, config.get("progress"), config.get("train", {}).get("job_id", ""))
        # The same object also watches the controller's states (one pickle keeps one object).
        callbacks = [*controller_init_kwargs["callbacks"], policy]
        if WATCH_PREEMPTIONS:
            # Ray Train hands this variable from the driver's environment to the controller,
            # which then starts no watcher actor of its own.
            os.environ[ENABLE_PREEMPTION_WATCHER_ENV_VAR] = "0"
            callbacks.append(InControllerPreemptionWatch())
        controller_init_kwargs["callbacks"] = callbacks
        return super()._initialize_and_run_controller(**controller_init_kwargs)


def build_trainer(cfg: TrainConfig, callbacks: list[Any], sink: Any, resize_interval_s: float = 30.0) -> TorchTrainer:
    remote = storage.is_remote(cfg.checkpoint_root)
    checkpoints = storage.resolve(cfg.checkpoint_root) if remote else None
    workers: int | tuple[int, int] = (
        cfg.min_workers if cfg.min_workers == cfg.max_workers else (cfg.min_workers, cfg.max_workers)
    )
    return JobTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg.to_dict(), "progress": sink},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=cfg.use_gpu,
            resources_per_worker={
                "CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {}),
                **cfg.resources_per_worker,
            },
            accelerator_type=cfg.accelerator_type if cfg.use_gpu else None,
            elastic_resize_monitor_interval_s=resize_interval_s,
        ),
        run_config=RunConfig(
            # Reusing the job id as the run name makes a re-dispatched attempt resume from
            # the latest checkpoint of the previous one.
            name=cfg.job_id,
            storage_path=checkpoints.path if checkpoints else cfg.checkpoint_root,
            # An object store is reached through the filesystem built from the environment's
            # endpoint and credentials (training/storage.py), the same one the service uses.
            storage_filesystem=checkpoints.filesystem if checkpoints else None,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint_keep),
            # Preemptions are expected on spot nodes and always resume; other platform
            # failures use the job's restart budget; user errors never retry (JobFailurePolicy).
            failure_config=FailureConfig(max_failures=cfg.max_restarts, max_preemption_failures=-1),
            callbacks=callbacks,
        ),
    )


def _fail(reporter: Reporter, exc: BaseException) -> None:
    user_error = find_user_error(exc)
    if user_error is not None:
        reporter.failed(user_error.code, user_error.message, user_error.param)
    else:
        reporter.failed("platform_error.training_failed", f"{type(exc).__name__}: {exc}", None)


def run(cfg: TrainConfig, spec: RunSpec, reporter: Reporter) -> int:
    """Run one attempt of a job to its end and report the outcome. Returns the exit code."""
    reporter.started(cfg.min_workers, cfg.max_workers)
    log.info("attempt %s starting: %s, %s-%s workers, %s steps", spec.attempt, cfg.strategy,
             cfg.min_workers, cfg.max_workers, cfg.total_steps)
    config = cfg.to_dict()
    sink = ProgressSink.remote(reporter, spec, config)
    callbacks = [RecordCheckpoints(reporter, spec, config), RecordRecovery(reporter, spec, config)]
    trainer = build_trainer(cfg, callbacks, sink, resize_interval_s=spec.resize_interval_s)
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - every failure becomes data on the job
        log.exception("job %s attempt %s failed", spec.job_id, spec.attempt)
        _fail(reporter, exc)
        return 1
    final_metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}
    # The sink flushes the trackers' last steps before the artifact takes their files.
    ray.get(sink.close.remote())
    if final_metrics.get("paused"):
        step = int(final_metrics.get("step", 0))
        if reporter.paused(step):
            log.info("job paused at step %s; its workers are released", step)
        return 0
    with result.checkpoint.as_directory() as directory, tempfile.TemporaryDirectory() as scratch:
        manifest = artifacts.build_manifest(cfg, final_metrics, spec.attempt)
        adapter = with_tensorboard(cfg.artifact_root, spec.job_id, Path(directory) / "adapter", Path(scratch))
        # Each attempt publishes under its own name: an attempt that went stale while it
        # finished can never replace the artifact of the attempt the job succeeded with.
        path = artifacts.publish(adapter, artifacts.destination(cfg.artifact_root, spec.job_id, spec.attempt), manifest)
    # An early stop ends the job before total_steps: it ends at the step it stopped at.
    step = int(final_metrics.get("step", cfg.total_steps))
    if not reporter.succeeded(str(path), final_metrics, step):
        log.warning("job %s moved on while attempt %s finished", spec.job_id, spec.attempt)
        return 0
    log.info("job succeeded; adapter written to %s", path)
    return 0
