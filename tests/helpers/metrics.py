"""Prometheus endpoints as the tests read them: the samples of one scrape, and a thread that keeps
what Ray's endpoint showed of one job while it ran."""

from __future__ import annotations

import threading

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.service_api import api

TRAINING_SERIES = {"ray_eft_train_loss", "ray_eft_train_learning_rate", "ray_eft_train_tokens_per_second",
                   "ray_eft_train_samples_per_second", "ray_eft_train_step_time_seconds",
                   "ray_eft_train_mfu", "ray_eft_train_peak_memory_bytes", "ray_eft_train_world_size",
                   "ray_eft_train_step", "ray_eft_train_tokens_total", "ray_eft_train_checkpoints_total",
                   "ray_eft_train_checkpoint_size_bytes", "ray_eft_train_eval_loss"}


def scrape(url: str) -> list:
    text = api.get(url, timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


class RaySeries(threading.Thread):
    """Scrapes Ray's endpoint every second while the job runs (gauges of a finished job's
    processes age out within seconds), keeping each series of our job id."""

    def __init__(self, url: str, job_id: str):
        super().__init__(daemon=True)
        self.url, self.job_id = url, job_id
        self.seen: dict[str, dict] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                for s in scrape(self.url):
                    if s.labels.get("job_id") == self.job_id:
                        self.seen[s.name] = {"labels": s.labels, "value": s.value}
            except Exception:  # noqa: BLE001 - the endpoint may not answer yet; keep polling
                pass
            self.done.wait(1.0)
