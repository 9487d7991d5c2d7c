"""Jobs through a deployed service, as the e2e journeys make and watch them: the request bodies,
polling with a deadline, the job's lists, and what a finished job left (its adapter, its losses)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.budgets import machine_factor
from tests.helpers.service_api import as_json, client

#: The custom resource the spot-node tests label their nodes with (tests/e2e/conftest.py).
SPOT = "eft_test_spot"


def lora_body(name: str, steps: int, workers: int | tuple[int, int] = 2, **extra: Any) -> dict:
    """A LoRA job on the bundled chat data whose result depends only on (seed, step): dropout off,
    a constant learning rate, DDP; `extra` merges into the body's sections."""
    low, high = (workers, workers) if isinstance(workers, int) else workers
    body = {
        "name": name,
        "model": "tiny-llama",
        "training_file": "demo/chat_train.jsonl",
        "method": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
        "hyperparameters": {"max_steps": steps, "learning_rate": 2e-3, "lr_scheduler": "constant",
                            "global_batch_size": 8, "micro_batch_size": 2, "max_seq_len": 96,
                            "seed": 11},
        "scaling": {"min_workers": low, "max_workers": high},
        "strategy": "ddp",
        "checkpoint": {"every_steps": 20, "keep": 2},
    }
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return body


def post(url: str, body: dict) -> dict:
    return as_json(client(url).jobs.create(body))


def fetch(url: str, job_id: str, what: str = "") -> Any:
    """The job, or with `what` one of its lists (`/metrics`, `/checkpoints`), as JSON."""
    jobs = client(url).jobs
    if not what:
        return as_json(jobs.retrieve(job_id))
    return as_json({"/metrics": jobs.metrics, "/checkpoints": jobs.checkpoints}[what](job_id))["data"]


def events_of(url: str, job_id: str) -> list[dict]:
    return as_json(client(url).jobs.list_events(job_id, limit=1000))["data"]


def until(what: str, check: Callable[[], Any], timeout_s: float = 240) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` otherwise. `timeout_s`
    is what a quiet machine needs at most; a slower machine gets proportionally longer
    (tests/helpers/budgets.py:machine_factor)."""
    factor = machine_factor()
    deadline = time.monotonic() + timeout_s * factor
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout_s * factor:.0f}s waiting for {what} "
                f"({timeout_s}s x{factor:.2f} for this machine's speed)")


def adapter_of(job: dict) -> dict[str, torch.Tensor]:
    return load_file(str(Path(job["artifact_path"]) / "adapter_model.safetensors"))


def assert_same_adapter(job: dict, reference: dict, atol: float) -> None:
    ours, theirs = adapter_of(job), adapter_of(reference)
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=atol, msg=name)


def losses_of(url: str, job_id: str) -> dict[int, float]:
    return {m["step"]: m["values"]["loss"] for m in fetch(url, job_id, "/metrics") if "loss" in m["values"]}


def at(event: dict) -> datetime:
    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00"))


def trained_steps(url: str, job_id: str) -> list[int]:
    return [m["step"] for m in fetch(url, job_id, "/metrics") if "loss" in m["values"]]


def step_at_least(url: str, job_id: str, step: int) -> bool:
    job = fetch(url, job_id)
    if job["status"] in ("succeeded", "failed", "cancelled"):
        pytest.fail(f"job {job_id} ended ({job['status']}) before step {step}: {job.get('error')}")
    return job["step"] >= step


def checkpointed(url: str, job_id: str, step: int) -> int:
    """The latest checkpoint's step once one at `step` or later is registered, else 0."""
    step_at_least(url, job_id, 0)  # fails early if the job already ended
    steps = [c["step"] for c in fetch(url, job_id, "/checkpoints")]
    return max(steps) if steps and max(steps) >= step else 0


def event_check(url: str, job_id: str, type_: str, where: Callable[[dict], bool] = lambda e: True):
    """A check for `until`: the job's first `type_` event that `where` accepts, failing at once
    if the job ends first."""
    def check() -> dict | None:
        job = fetch(url, job_id)
        if job["status"] in ("succeeded", "failed", "cancelled"):
            pytest.fail(f"job ended ({job['status']}) at step {job['step']} before a {type_} event: {job.get('error')}")
        return next((e for e in events_of(url, job_id) if e["type"] == type_ and where(e)), None)

    return check


def ray_job_id(dashboard_url: str, submission_id: str) -> str:
    """The Ray job id of one Ray Jobs submission (a job's attempt)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(dashboard_url).get_job_info(submission_id).job_id


def worker_pids(dashboard_url: str, job: dict) -> list[int]:
    """The pids of the live Ray Train workers of `job`'s current attempt (other jobs may run
    beside it)."""
    from ray.util.state import list_actors

    submission = job.get("ray_submission_id") or f"{job['id']}-attempt-{job['attempt']}"
    actors = list_actors(address=dashboard_url, filters=[
        ("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE"),
        ("job_id", "=", ray_job_id(dashboard_url, submission))])
    return [a.pid for a in actors if a.pid]
