"""What a job will cost before it runs, and what it has cost so far.

Before the run (at validation): the tokens it will train (steps x global batch x the dataset's
mean example length) over the throughput per worker that similar jobs measured (same base
model, method, strategy and device kind: the median of their last reported `tokens_per_s` per
worker), at the job's minimum and maximum size; the worker hours that follow, and their cost
at the deployment's prices (`EFT_PRICES`, per worker hour, spot and on-demand apart). With no
similar job yet there is no duration: the job's ETA appears after its first steps
(`estimated_finish`), and the next such job has a basis.

While it runs: the worker time its groups have held (seconds x workers, from its progress
reports), spot apart, and the cost so far at the prices it was accepted under.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from eft.service.settings import Settings
from eft.service.store.store import Store
from eft.training.config import TrainConfig
from eft.types.jobs import JobStatus

#: Finished jobs looked at for a throughput basis (the newest first).
SIMILAR_JOBS = 200
KEYS = ("model_path", "method", "strategy", "use_gpu", "objective")


def _similar(config: Mapping[str, Any], other: Mapping[str, Any] | None) -> bool:
    return other is not None and all(other.get(k) == config.get(k) for k in KEYS)


def is_spot(config: Mapping[str, Any], settings: Settings) -> bool:
    return bool(set((config.get("resources_per_worker") or {})) & set(settings.spot_resources))


def throughput_basis(store: Store, config: Mapping[str, Any]) -> tuple[float | None, int]:
    """Median tokens/s per worker of finished similar jobs, and how many there were."""
    done = store.list_jobs(statuses=[JobStatus.succeeded], limit=SIMILAR_JOBS)[0]
    similar = [j for j in done if _similar(config, j.config)]
    latest = store.latest_metric_values(j.id for j in similar)
    rates = [float(v["tokens_per_s"]) / max(1.0, float(v.get("world_size") or 1.0))
             for v in latest.values() if v.get("tokens_per_s")]
    return (statistics.median(rates) if rates else None), len(rates)


def estimate(store: Store, config: TrainConfig, stats: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """The job's estimate, as stored on it at validation."""
    cfg = config.to_dict()
    per_example = float(stats.get("train_tokens", 0)) / max(1, int(stats.get("train_examples", 0) or 1))
    tokens = int(config.total_steps * config.global_batch_size * per_example)
    rate, basis_jobs = throughput_basis(store, cfg)
    result: dict[str, Any] = {
        "tokens": tokens, "spot": is_spot(cfg, settings), "gpu": config.use_gpu,
        "prices": settings.prices.model_dump(), "tokens_per_s_per_worker": rate,
        "basis": (f"the median throughput of {basis_jobs} finished similar job(s) (same model, method, strategy "
                  "and device)") if rate else "none yet: no similar job has finished; the ETA follows its first steps",
    }
    if rate:
        low, high = config.min_workers, config.max_workers
        hours = tokens / rate / 3600.0  # worker hours: the same at any size when scaling is linear
        result.update(
            duration_s=round(tokens / (rate * low), 1), duration_s_at_max=round(tokens / (rate * high), 1),
            worker_hours=round(hours, 4), gpu_hours=round(hours, 4) if config.use_gpu else 0.0,
            cost=round(hours * settings.prices.per_hour(result["spot"], config.use_gpu), 4),
        )
    return result


def usage(worker_seconds: float, spot_worker_seconds: float, estimate: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the job has used: worker hours (spot and on-demand apart), GPU hours, and the cost
    at the prices it was accepted under."""
    estimate = estimate or {}
    spot_h = spot_worker_seconds / 3600.0
    demand_h = max(0.0, worker_seconds - spot_worker_seconds) / 3600.0
    gpu = bool(estimate.get("gpu"))
    prices = estimate.get("prices") or {}
    cost = None
    if prices:
        kind = "gpu" if gpu else "cpu"
        cost = round(demand_h * float(prices.get(f"{kind}_hour", 0.0)) + spot_h * float(prices.get(f"spot_{kind}_hour", 0.0)), 6)
    return {
        "worker_hours": round(spot_h + demand_h, 6), "spot_worker_hours": round(spot_h, 6),
        "on_demand_worker_hours": round(demand_h, 6), "gpu_hours": round(spot_h + demand_h, 6) if gpu else 0.0,
        "cost": cost, "currency": prices.get("currency"),
    }
