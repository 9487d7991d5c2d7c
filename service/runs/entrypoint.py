"""The Ray Job entrypoint of one job attempt: reads the job, wires training to the store, runs it.

Run by the launcher (service/runs/launcher.py) as
    python -m eft.service.runs.entrypoint --job-id ftjob-... --attempt N
with the service's `EFT_*` settings in the environment. Training itself reads no settings and
opens no store: it gets the job's `TrainConfig`, a `RunSpec` and a `StoreReporter`, which writes
progress, checkpoints and the outcome into the job store, fenced by the attempt so a stale
attempt can never overwrite a newer one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from eft.planner.architectures import architecture_from_config
from eft.service import jsonlog
from eft.service.runs.reporter import StoreReporter
from eft.service import credentials
from eft.service.settings import Settings, get_settings, redacted_url
from eft.service.store.store import JobRecord, Store
from eft.training import driver
from eft.training.config import TrainConfig
from eft.training.reporting import RunSpec
from eft.training.telemetry import flops_per_token, peak_flops_per_worker
from eft.types.jobs import JobStatus

log = logging.getLogger("eft.entrypoint")


def model_flops_per_token(config: dict[str, Any]) -> float | None:
    """Training FLOPs per token of a job's TrainConfig dict, from its model's config.json; None
    when the architecture cannot be read."""
    try:
        arch = architecture_from_config(config["model_path"])
    except Exception:  # noqa: BLE001 - MFU is optional; a model we cannot count has none
        return None
    method = config.get("method", "lora")
    lora = config.get("lora") or {}
    trainable = arch.parameters
    if method != "full":
        targets = lora.get("target_modules", "all-linear")
        trainable = arch.lora_parameters(int(lora.get("r", 8)), tuple(targets) if isinstance(targets, list) else targets)
    return flops_per_token(method, arch.parameters, trainable)


def run_spec(job: Any, settings: Settings) -> RunSpec:
    """What training needs to know of a stored job's attempt besides its TrainConfig."""
    config = job.config or {}
    wanted = (job.request or {}).get("trackers") or {}
    return RunSpec(
        job_id=job.id, attempt=job.attempt, tenant=job.tenant, name=job.name,
        flops_per_token=model_flops_per_token(config),
        peak_flops=peak_flops_per_worker(bool(config.get("use_gpu")), settings.gpu_type,
                                         settings.peak_tflops_per_worker),
        resize_interval_s=settings.resize_interval_s,
        tensorboard=bool(wanted.get("tensorboard")),
        mlflow_tracking_uri=settings.resolved_mlflow_tracking_uri if wanted.get("mlflow") else None,
    )


def run(job_id: str, attempt: int) -> int:
    """Run one attempt of a job. Returns the process exit code."""
    credentials.load()
    settings = get_settings()
    expected = os.environ.get("EFT_DATABASE_URL_REDACTED")
    if expected and redacted_url(settings.resolved_database_url) != expected:
        # Without its credentials the driver would open a default store, not the service's.
        log.error("this driver cannot reach the service's database %s (it has %s): put "
                  "EFT_DATABASE_URL in the node's environment or in the secrets file "
                  "EFT_SECRETS_FILE names (docs/operations.md)", expected,
                  redacted_url(settings.resolved_database_url))
        return 2
    store = Store(settings.resolved_database_url, migrate=False)
    job = store.get_job(job_id)
    if job.attempt != attempt or job.status not in (JobStatus.running, JobStatus.pausing, JobStatus.cancelling):
        log.warning("job %s is %s on attempt %s; attempt %s exits", job_id, job.status, job.attempt, attempt)
        return 0
    # One engine per process: the driver's reporter shares this store.
    reporter = StoreReporter(settings.resolved_database_url, job_id, attempt, store=store)
    return driver.run(train_config(job), run_spec(job, settings), reporter)


def train_config(job: JobRecord) -> TrainConfig:
    """The job's TrainConfig, placed on the GPU type the cluster scheduler pinned it to (it plans
    the job's growth there too)."""
    pinned = (job.schedule or {}).get("accelerator_type")
    return TrainConfig.from_dict({**(job.config or {}), **({"accelerator_type": pinned} if pinned else {})})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    args = parser.parse_args(argv)
    jsonlog.configure()
    jsonlog.bind(job_id=args.job_id, attempt=args.attempt)
    return run(args.job_id, args.attempt)


if __name__ == "__main__":
    sys.exit(main())
