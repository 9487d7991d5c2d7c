"""Cost and time: a job's estimate at validation from similar jobs' measured throughput, and the
worker hours (spot and on-demand apart) and cost it has used, on the job and in /v1.

Run: .venv/bin/python -m pytest tests/integration/test_estimates.py -q
"""

from __future__ import annotations

import pytest

from eft.service.jobs.wire import to_wire
from eft.service.jobs.openai import to_openai_job
from eft.service.runs.reporter import StoreReporter
from eft.service.scheduling.scheduler import Scheduler
from eft.service.settings import Prices, Settings
from eft.service.store.store import Store
from eft.training.config import TrainConfig
from eft.types.jobs import JobStatus

from tests.helpers.fakes import RecordingLauncher

PRICES = Prices(gpu_hour=2.0, spot_gpu_hour=0.5, cpu_hour=0.1, spot_cpu_hour=0.04)
REQUEST = {"model": "tiny-llama", "training_file": "t.jsonl"}


def validate(job, settings):
    """100 steps of 8 examples; the dataset's examples average 50 tokens."""
    extra = job.request["metadata"]  # what this test varies
    cfg = TrainConfig(job_id=job.id, model_path=extra.get("model", "models/a"), training_file="t",
                      validation_file=None, method="lora", lora=None, total_steps=100, num_train_examples=10,
                      global_batch_size=8, min_workers=1, max_workers=int(extra.get("max", 1)),
                      use_gpu="gpu" in extra, resources_per_worker={"spot": 1} if "spot" in extra else {})
    return cfg, {"train_examples": 10, "train_tokens": 500}


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    yield s
    s.close()


def _validated(store: Store, settings: Settings, **test) -> str:
    job = store.create_job(tenant="t", request={**REQUEST, "metadata": {k: str(v) for k, v in test.items()}})
    Scheduler(store, RecordingLauncher(), settings.model_copy(update={"dispatch_paused": True}), validate,
              nodes=lambda: None).tick()
    assert store.get_job(job.id).status is JobStatus.queued
    return job.id


def test_the_estimate_comes_from_similar_finished_jobs_throughput(store):
    settings = Settings(prices=PRICES)
    # No similar job yet: the tokens are known, the duration is not.
    first = _validated(store, settings, max=2)
    estimate = to_wire(store.get_job(first)).estimate
    assert estimate.tokens == 100 * 8 * 50 and estimate.duration_s is None and "none yet" in estimate.basis
    # It runs on 2 workers at 400 tokens/s and finishes: 200 tokens/s per worker.
    store.transition(first, JobStatus.running, "go", attempt=1)
    store.record_metrics(first, 1, 100, {"tokens_per_s": 400.0, "world_size": 2.0})
    store.transition(first, JobStatus.succeeded, "done")
    other_model = _validated(store, settings, model="models/b")
    assert to_wire(store.get_job(other_model)).estimate.duration_s is None  # another model: no basis
    second = _validated(store, settings, max=4)
    estimate = to_wire(store.get_job(second)).estimate
    assert estimate.tokens_per_s_per_worker == 200.0 and "1 finished similar job" in estimate.basis
    assert estimate.duration_s == 40000 / 200 and estimate.duration_s_at_max == 40000 / 800
    hours = 40000 / 200 / 3600
    assert estimate.worker_hours == round(hours, 4) and estimate.gpu_hours == 0.0
    assert estimate.cost == round(hours * PRICES.cpu_hour, 4)


def test_usage_counts_worker_time_spot_apart_and_prices_it(store):
    settings = Settings(prices=PRICES, spot_resources=["spot"])
    spot_job = _validated(store, settings, gpu=True, spot=True)
    demand_job = _validated(store, settings, gpu=True)
    for job_id in (spot_job, demand_job):
        store.transition(job_id, JobStatus.running, "go", attempt=1)
        reporter = StoreReporter("", job_id, 1, store=store)
        reporter.usage(1800.0)  # two workers for 15 minutes
        reporter.usage(1800.0)
    StoreReporter("", demand_job, 0, store=store).usage(3600.0)  # a stale attempt's report: dropped
    spot = to_wire(store.get_job(spot_job)).usage
    assert (spot.worker_hours, spot.spot_worker_hours, spot.on_demand_worker_hours, spot.gpu_hours) == (1, 1, 0, 1)
    assert spot.cost == PRICES.spot_gpu_hour and spot.currency == "USD"
    demand = to_wire(store.get_job(demand_job))
    assert demand.usage.on_demand_worker_hours == 1 and demand.usage.cost == PRICES.gpu_hour
    # /v1 carries the same totals, with the estimate's.
    v1 = to_openai_job(demand, "t").usage
    assert v1["gpu_hours"] == 1 and v1["cost"] == PRICES.gpu_hour and "estimated_gpu_hours" in v1
