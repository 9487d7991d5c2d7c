"""The service's own Prometheus metrics, served at `GET /metrics` (prometheus_client text format).

Requests are counted by route template (`/jobs/{job_id}`, not the id) and status, with a
latency histogram; the scheduler observes validation time, queue wait and dispatch latency;
jobs by status and the queue depth are read from the job store at scrape time, so every
replica reports the same cluster-wide numbers. Training metrics are not here: Ray exports them
(training/telemetry.py).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from eft.types.jobs import JobStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REGISTRY = CollectorRegistry(auto_describe=True)
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_WAIT_SECONDS = (0.5, 1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)

REQUESTS = Counter("eft_http_requests", "HTTP requests by method, route template and status.",
                   ("method", "route", "status"), registry=REGISTRY)
REQUEST_SECONDS = Histogram("eft_http_request_duration_seconds", "HTTP request latency.",
                            ("method", "route"), buckets=_SECONDS, registry=REGISTRY)
VALIDATION_SECONDS = Histogram("eft_job_validation_seconds", "Time to validate a job (data, tokens, plan).",
                               ("outcome",), buckets=_SECONDS, registry=REGISTRY)
QUEUE_WAIT_SECONDS = Histogram("eft_job_queue_wait_seconds", "Time from creation (or requeue) to dispatch.",
                               buckets=_WAIT_SECONDS, registry=REGISTRY)
DISPATCH_SECONDS = Histogram("eft_job_dispatch_seconds", "Time to submit a job attempt as a Ray Job.",
                             ("outcome",), buckets=_SECONDS, registry=REGISTRY)


class StoreCollector:
    """Jobs by status and the queue, read from the store when scraped."""

    def __init__(self, store: Any):
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.store.count_by_status()
        jobs = GaugeMetricFamily("eft_jobs", "Jobs in the store by status.", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status.value, 0))
        yield jobs
        yield GaugeMetricFamily("eft_queue_depth", "Jobs queued for dispatch.",
                                value=counts.get(JobStatus.queued.value, 0))
        queued, _ = self.store.list_jobs(statuses=[JobStatus.queued], oldest_first=True, limit=1)
        oldest = time.time() - queued[0].updated_at.timestamp() if queued else 0.0
        yield GaugeMetricFamily("eft_queue_oldest_wait_seconds", "How long the oldest queued job has waited.",
                                value=max(0.0, oldest))


def metric_names() -> set[str]:
    """Series names the service exports (the Grafana test checks queries against them)."""
    names = {"eft_jobs", "eft_queue_depth", "eft_queue_oldest_wait_seconds"}
    for metric in REGISTRY.collect():
        names.update(sample.name for sample in metric.samples)
        if metric.type == "histogram":
            names.update(f"{metric.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        if metric.type == "counter":
            names.add(f"{metric.name}_total")
    return names


def render(store: Any) -> bytes:
    """The exposition text: the process's counters and histograms plus the store's gauges."""
    per_scrape = CollectorRegistry(auto_describe=False)
    per_scrape.register(StoreCollector(store))
    return generate_latest(REGISTRY) + generate_latest(per_scrape)


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    REQUESTS.labels(method, route, str(status)).inc()
    REQUEST_SECONDS.labels(method, route).observe(seconds)
