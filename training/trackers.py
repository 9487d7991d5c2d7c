"""Experiment trackers a job logs its step metrics to, besides the job store and Prometheus.

MLflow goes through MLflow's own client to the service's `EFT_MLFLOW_TRACKING_URI` (default a
file store, `<home>/mlruns`; `mlflow ui --backend-store-uri <that>` shows it), one run per
attempt named `<name> (<job id>)` in the `eft-<tenant>` experiment, tagged with the job id.
TensorBoard goes through tensorboardX's `SummaryWriter` (the writer Ray Tune's TensorBoard
logger uses) from the progress sink, so training itself is untouched. While the job runs the
event files are under `<artifact root>/<job id>.tensorboard/attempt-<n>` (point `tensorboard
--logdir` there to watch live; with an object-store artifact root, under the system temp dir of
the node that runs the job's progress sink); the driver puts them into the artifact's
`tensorboard/` folder before it publishes, so they are part of the one atomic publish.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from eft.training import storage
from eft.training.reporting import RunSpec


def tensorboard_root(artifact_root: str | Path, job_id: str) -> Path:
    if storage.is_remote(str(artifact_root)):
        return Path(tempfile.gettempdir()) / "eft-tensorboard" / f"{job_id}.tensorboard"
    return Path(artifact_root) / f"{job_id}.tensorboard"


class TensorBoardTracker:
    """Scalars per step, one run folder per attempt."""

    def __init__(self, artifact_root: str | Path, job_id: str, attempt: int):
        from tensorboardX import SummaryWriter

        self.logdir = tensorboard_root(artifact_root, job_id) / f"attempt-{attempt}"
        self.writer = SummaryWriter(logdir=str(self.logdir), flush_secs=5)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"train/{key}" if key != "eval_loss" else "eval/loss", value, step)

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """Step metrics to an MLflow run, through MLflow's client."""

    def __init__(self, tracking_uri: str, spec: RunSpec):
        import os

        if tracking_uri.startswith("file:"):
            # MLflow 3 keeps its file store behind an opt-in; it is the local default here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        name = f"eft-{spec.tenant}"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run = self.client.create_run(
            experiment_id, run_name=f"{spec.name or 'job'} ({spec.job_id})",
            tags={"eft.job_id": spec.job_id, "eft.attempt": str(spec.attempt), "eft.tenant": spec.tenant},
        )
        self.run_id = run.info.run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now_ms, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def trackers_for(spec: RunSpec, artifact_root: str | None) -> list[Any]:
    """The trackers an attempt's spec asks for."""
    trackers: list[Any] = []
    if spec.tensorboard and artifact_root:
        trackers.append(TensorBoardTracker(artifact_root, spec.job_id, spec.attempt))
    if spec.mlflow_tracking_uri:
        trackers.append(MLflowTracker(spec.mlflow_tracking_uri, spec))
    return trackers


def with_tensorboard(artifact_root: str | Path, job_id: str, adapter_dir: Path, scratch: Path) -> Path:
    """The directory to publish: `adapter_dir` itself when the job wrote no TensorBoard runs,
    else a copy of it under `scratch` with the runs in `tensorboard/` (the checkpoint that
    holds `adapter_dir` is never modified)."""
    source = tensorboard_root(artifact_root, job_id)
    if not source.is_dir():
        return adapter_dir
    staged = Path(shutil.copytree(adapter_dir, scratch / "adapter"))
    shutil.copytree(source, staged / "tensorboard")
    return staged
