"""The model servers' metrics, exported through `ray.util.metrics` (Ray's node endpoint, which
Prometheus scrapes as it does the training metrics), labelled by base model and tenant:

- `eft_serving_generated_tokens` (counter; tokens/s is its rate), by base model, model and tenant;
- `eft_serving_time_to_first_token_seconds` (histogram), by base model and tenant;
- `eft_serving_requests_running` and `eft_serving_requests_waiting` (gauges: generating, and
  admitted but without a first token yet), `eft_serving_kv_cache_reserved` (the share of the
  engine's KV cache its admitted requests may reach) and `eft_serving_adapters_loaded`, by base model.

Outside a Ray worker (a benchmark, a test of the engine alone) nothing is exported.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

log = logging.getLogger("eft.inference")

FIRST_TOKEN_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0]


@lru_cache(maxsize=1)
def _metrics() -> dict[str, Any] | None:
    import ray

    if not ray.is_initialized():
        return None
    from ray.util.metrics import Counter, Gauge, Histogram

    return {
        "tokens": Counter("eft_serving_generated_tokens", description="Tokens the model servers generated.",
                          tag_keys=("base_model", "model", "tenant")),
        "first_token": Histogram("eft_serving_time_to_first_token_seconds",
                                 description="From a completion's arrival at the model server to its first token.",
                                 boundaries=FIRST_TOKEN_BUCKETS, tag_keys=("base_model", "tenant")),
        "running": Gauge("eft_serving_requests_running", description="Completions generating.",
                         tag_keys=("base_model",)),
        "waiting": Gauge("eft_serving_requests_waiting", description="Completions admitted, no token yet.",
                         tag_keys=("base_model",)),
        "kv": Gauge("eft_serving_kv_cache_reserved", description="Share of the KV cache admitted requests may reach.",
                    tag_keys=("base_model",)),
        "adapters": Gauge("eft_serving_adapters_loaded", description="Adapters loaded on the base model.",
                          tag_keys=("base_model",)),
    }


class ServingTelemetry:
    """One engine's metrics; every call is a no-op outside Ray, and never raises."""

    def __init__(self, base_model: str):
        self.base = base_model
        self.running = self.waiting = 0

    def _do(self, name: str, method: str, value: float, **tags: str) -> None:
        try:
            metrics = _metrics()
            if metrics is not None:
                getattr(metrics[name], method)(value, tags={"base_model": self.base, **tags})
        except Exception:  # noqa: BLE001 - metrics never fail a completion
            log.debug("could not record %s", name, exc_info=True)

    def admitted(self) -> None:
        self.waiting += 1
        self._do("waiting", "set", self.waiting)

    def first_token(self, tenant: str, seconds: float) -> None:
        self.waiting -= 1
        self.running += 1
        self._do("waiting", "set", self.waiting)
        self._do("running", "set", self.running)
        self._do("first_token", "observe", seconds, tenant=tenant)

    def finished(self, started: bool) -> None:
        if started:
            self.running -= 1
            self._do("running", "set", self.running)
        else:
            self.waiting -= 1
            self._do("waiting", "set", self.waiting)

    def tokens(self, model: str, tenant: str, count: int) -> None:
        if count > 0:
            self._do("tokens", "inc", count, model=model, tenant=tenant)

    def state(self, kv_reserved: float | None, adapters: int) -> None:
        if kv_reserved is not None:
            self._do("kv", "set", kv_reserved)
        self._do("adapters", "set", adapters)


def exported_names() -> set[str]:
    """Prometheus series names of these metrics as Ray exports them (a `ray_` prefix; counters
    end in `_total`, histograms give `_bucket`, `_count` and `_sum`)."""
    return {"ray_eft_serving_generated_tokens_total", "ray_eft_serving_requests_running",
            "ray_eft_serving_requests_waiting", "ray_eft_serving_kv_cache_reserved", "ray_eft_serving_adapters_loaded",
            *(f"ray_eft_serving_time_to_first_token_seconds_{s}" for s in ("bucket", "count", "sum"))}
