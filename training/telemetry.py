"""Training metrics exported through `ray.util.metrics`, labelled by job id, tenant and name.

They are set from the job's driver side (the progress sink that rank 0 already sends each
logged step to, and the Train controller's callbacks), never from inside the training step, so
exporting them adds no host synchronisation to training. Ray's metrics agent serves them on
every node's Prometheus endpoint (`metrics_export_port`) with Ray's `ray_` prefix, e.g.
`ray_eft_train_loss{job_id="ftjob-..."}`; the dashboard's Metrics view and
deploy/grafana/ read them from there.

MFU (model FLOPs utilisation) = achieved model FLOP/s / (peak FLOP/s per worker x workers):
- full fine-tuning: 6N FLOPs per token (2N forward, 4N backward), N = base parameters;
- LoRA / QLoRA: 4N + 6P per token, P = adapter parameters: the forward (2N) and the backward
  through the frozen weights to the activations (2N) still run, but the frozen weights need
  no weight gradient (the 2N that would make 6N); the adapter itself costs 6P.
Attention's sequence-length term is left out, as in the usual 6N convention. The peak is
`EFT_PEAK_TFLOPS_PER_WORKER`; when unset, a GPU worker assumes its dense bf16 peak by
`EFT_GPU_TYPE` (A100 312, H100 989 TFLOP/s) and a CPU worker 1 TFLOP/s, a round figure for a
few server cores: compare CPU MFU between runs, not with GPUs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eft.training.reporting import RunSpec

log = logging.getLogger("eft.telemetry")

#: Tags on every training metric.
JOB_TAGS = ("job_id", "tenant", "job_name")
#: Dense bf16 peak TFLOP/s per GPU, by the `gpu_type` setting.
GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "L4": 121.0, "A10G": 125.0}
CPU_PEAK_TFLOPS = 1.0
DEFAULT_GPU_PEAK_TFLOPS = 312.0


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "gauge" | "counter"
    description: str
    extra_tags: tuple[str, ...] = ()


#: Every training metric: one place, read by the exporter below, the Grafana dashboard test
#: and the docs.
TRAINING_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("eft_train_loss", "gauge", "Training loss (mean target-token cross-entropy) of the last logged steps."),
    MetricSpec("eft_train_eval_loss", "gauge", "Validation loss."),
    MetricSpec("eft_train_reward_margin", "gauge",
               "DPO: mean reward margin (chosen minus rejected, beta x log-ratio to the reference); "
               "split 'train' or 'eval'.", ("split",)),
    MetricSpec("eft_train_reward_accuracy", "gauge",
               "DPO: share of pairs whose chosen reply out-rewards the rejected one; split 'train' or 'eval'.",
               ("split",)),
    MetricSpec("eft_train_rewards", "gauge", "DPO: mean reward of the chosen and of the rejected replies "
               "(training pairs).", ("reply",)),
    MetricSpec("eft_train_learning_rate", "gauge", "Learning rate of the last step."),
    MetricSpec("eft_train_grad_norm", "gauge", "Gradient norm before clipping."),
    MetricSpec("eft_train_tokens_per_second", "gauge", "Input tokens per second, all workers."),
    MetricSpec("eft_train_samples_per_second", "gauge", "Training examples per second, all workers."),
    MetricSpec("eft_train_step_time_seconds", "gauge", "Seconds per optimizer step (slowest worker)."),
    MetricSpec("eft_train_mfu", "gauge", "Model FLOPs utilisation, 0-1 (see training/telemetry.py)."),
    MetricSpec("eft_train_step", "gauge", "Optimizer steps done."),
    MetricSpec("eft_train_total_steps", "gauge", "Optimizer steps the job will train."),
    MetricSpec("eft_train_world_size", "gauge", "Training workers."),
    MetricSpec("eft_train_peak_memory_bytes", "gauge",
               "Peak memory per worker: accelerator (CUDA allocator; host RSS on CPU) or host (RSS); "
               "rank 'max' is the largest over workers.", ("memory", "rank")),
    MetricSpec("eft_train_tokens", "counter", "Input tokens trained."),
    MetricSpec("eft_train_restarts", "counter", "Worker-group restarts after platform failures."),
    MetricSpec("eft_train_preemptions", "counter", "Node preemptions ridden out."),
    MetricSpec("eft_train_resizes", "counter", "Elastic changes of the number of workers."),
    MetricSpec("eft_train_lost_steps", "counter", "Steps trained again after a resume."),
    MetricSpec("eft_train_checkpoints", "counter", "Checkpoints persisted.", ("reason",)),
    MetricSpec("eft_train_checkpoint_save_seconds", "gauge", "Seconds the last checkpoint took to save."),
    MetricSpec("eft_train_checkpoint_size_bytes", "gauge", "Size of the last checkpoint."),
)

#: Step metric (as rank 0 reports it) -> gauge.
_STEP_GAUGES = {
    "loss": "eft_train_loss", "eval_loss": "eft_train_eval_loss",
    "learning_rate": "eft_train_learning_rate", "grad_norm": "eft_train_grad_norm",
    "tokens_per_s": "eft_train_tokens_per_second", "step_time_s": "eft_train_step_time_seconds",
    "world_size": "eft_train_world_size", "step": "eft_train_step",
}


#: DPO step metric -> gauge and its tags.
_PAIR_GAUGES = (
    ("reward_margin", "eft_train_reward_margin", {"split": "train"}),
    ("eval_reward_margin", "eft_train_reward_margin", {"split": "eval"}),
    ("reward_accuracy", "eft_train_reward_accuracy", {"split": "train"}),
    ("eval_reward_accuracy", "eft_train_reward_accuracy", {"split": "eval"}),
    ("rewards_chosen", "eft_train_rewards", {"reply": "chosen"}),
    ("rewards_rejected", "eft_train_rewards", {"reply": "rejected"}),
)


def exported_names() -> set[str]:
    """Prometheus series names of the training metrics as Ray exports them: a `ray_` prefix,
    and counters with a `_total` suffix."""
    return {f"ray_{s.name}_total" if s.kind == "counter" else f"ray_{s.name}" for s in TRAINING_METRICS}


def flops_per_token(method: str, base_parameters: int, trainable_parameters: int) -> float:
    """Model FLOPs per trained token: 6N for full fine-tuning, 4N + 6P for LoRA and QLoRA."""
    if method == "full":
        return 6.0 * base_parameters
    return 4.0 * base_parameters + 6.0 * trainable_parameters


def peak_flops_per_worker(use_gpu: bool, gpu_type: str | None, peak_tflops: float | None) -> float:
    """Peak FLOP/s of one worker: the setting, else the GPU type's bf16 peak, else the CPU default."""
    if peak_tflops:
        return peak_tflops * 1e12
    if use_gpu:
        return GPU_PEAK_TFLOPS.get((gpu_type or "").upper(), DEFAULT_GPU_PEAK_TFLOPS) * 1e12
    return CPU_PEAK_TFLOPS * 1e12


@lru_cache(maxsize=1)
def _metrics() -> dict[str, Any]:
    """The metric objects of this process (Ray metrics belong to the process that made them)."""
    from ray.util.metrics import Counter, Gauge

    kinds = {"gauge": Gauge, "counter": Counter}
    return {s.name: kinds[s.kind](s.name, description=s.description, tag_keys=JOB_TAGS + s.extra_tags)
            for s in TRAINING_METRICS}


class JobTelemetry:
    """Sets one job's training metrics. Cheap to pickle: metric objects are made on first use."""

    def __init__(self, job_id: str, tenant: str, job_name: str | None, config: dict[str, Any] | None = None,
                 peak_flops: float | None = None, metrics: dict[str, Any] | None = None,
                 flops_per_token: float | None = None):
        self.tags = {"job_id": job_id, "tenant": tenant, "job_name": job_name or ""}
        config = config or {}
        self.global_batch_size = int(config.get("global_batch_size", 0)) or None
        self.total_steps = config.get("total_steps")
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.last_step: int | None = None
        #: Metric name -> object with set/inc(value, tags=...); Ray's by default.
        self._registry = metrics

    def _set(self, name: str, value: float, **extra: str) -> None:
        try:
            (self._registry or _metrics())[name].set(float(value), tags={**self.tags, **extra})
        except Exception:  # noqa: BLE001 - metrics must never break training bookkeeping
            log.debug("could not set %s", name, exc_info=True)

    def _inc(self, name: str, value: float = 1.0, **extra: str) -> None:
        if value <= 0:
            return
        try:
            (self._registry or _metrics())[name].inc(float(value), tags={**self.tags, **extra})
        except Exception:  # noqa: BLE001
            log.debug("could not increment %s", name, exc_info=True)

    def step(self, step: int, values: dict[str, float]) -> float:
        """Export one logged step's metrics (as rank 0 reports them). Returns the input
        tokens trained since the previous logged step."""
        for key, name in _STEP_GAUGES.items():
            if key in values:
                self._set(name, values[key])
        if self.total_steps:
            self._set("eft_train_total_steps", self.total_steps)
        for key, name, tags in _PAIR_GAUGES:  # DPO jobs
            if key in values:
                self._set(name, values[key], **tags)
        step_time = values.get("step_time_s")
        tokens_per_s = values.get("tokens_per_s")
        if step_time and self.global_batch_size:
            self._set("eft_train_samples_per_second", self.global_batch_size / step_time)
        tokens = 0.0
        if tokens_per_s is not None and step_time and self.last_step is not None and step > self.last_step:
            tokens = tokens_per_s * step_time * (step - self.last_step)
            self._inc("eft_train_tokens", tokens)
        world = values.get("world_size")
        if tokens_per_s and world and self.flops_per_token and self.peak_flops:
            self._set("eft_train_mfu", tokens_per_s * self.flops_per_token / (self.peak_flops * world))
        self._memory(values)
        self.last_step = step
        return tokens

    def _memory(self, values: dict[str, float]) -> None:
        if "peak_memory_gb" in values:
            self._set("eft_train_peak_memory_bytes", values["peak_memory_gb"] * 1e9, memory="accelerator", rank="max")
        if "host_peak_memory_gb" in values:
            self._set("eft_train_peak_memory_bytes", values["host_peak_memory_gb"] * 1e9, memory="host", rank="max")
        for key, value in values.items():
            if key.startswith("peak_memory_gb_rank"):
                self._set("eft_train_peak_memory_bytes", value * 1e9, memory="accelerator",
                          rank=key.removeprefix("peak_memory_gb_rank"))

    def counts(self, **deltas: int) -> None:
        """Count restarts, preemptions, resizes or lost steps."""
        for key, value in deltas.items():
            self._inc(f"eft_train_{key}", value)

    def checkpoint(self, reason: str, save_seconds: float | None, size_bytes: int | None) -> None:
        self._inc("eft_train_checkpoints", 1, reason=reason)
        if save_seconds is not None:
            self._set("eft_train_checkpoint_save_seconds", save_seconds)
        if size_bytes is not None:
            self._set("eft_train_checkpoint_size_bytes", size_bytes)


def for_run(spec: RunSpec, config: dict[str, Any]) -> JobTelemetry:
    """The telemetry of one attempt: tags from its spec, MFU inputs from the spec and its config."""
    return JobTelemetry(spec.job_id, spec.tenant, spec.name, config, spec.peak_flops,
                        flops_per_token=spec.flops_per_token)
