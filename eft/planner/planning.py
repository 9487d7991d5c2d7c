"""`plan(spec)`: every candidate configuration with its memory, and the fastest one that fits.

In the spirit of the study's Figure 4 matrix: enable only the optimizations the memory needs,
because each one costs time. A candidate fits when its predicted total is at most the GPU's
memory. When none fits, `nearest_fit(spec)` says what would make one fit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from eft.planner.architectures import PlannerError
from eft.planner.memory import MemoryEstimate, estimate_memory
from eft.planner.serving import GIB, serving_memory
from eft.planner.spec import (
    OFFLOADS,
    OFFLOADS_BY_STRATEGY,
    STRATEGIES,
    STRATEGY_PREFERENCE,
    Configuration,
    PlanSpec,
)
from eft.planner.timing import relative_time, supports_flash_attention

MAX_GPUS = 4096  # the most workers a job may ask for (api.models.Scaling)


@dataclass(frozen=True)
class Candidate:
    """One configuration, its predicted memory and time, and why it was kept or rejected."""

    config: Configuration
    memory: MemoryEstimate
    fits: bool
    relative_time: float
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {"strategy": c.strategy, "offload": c.offload,
                "gradient_checkpointing": c.gradient_checkpointing, "attention": c.attention,
                "fits": self.fits, "relative_time": round(self.relative_time, 3),
                "memory_gb": self.memory.as_dict(), "reason": self.reason}


@dataclass(frozen=True)
class Suggestion:
    """A change to the request that makes a configuration fit, and the configuration it gives."""

    change: str
    """What to change: strategy, offload, micro_batch, gpus, method or seq_len."""
    value: str | int
    message: str
    chosen: Candidate

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "value": self.value, "message": self.message,
                "chosen": self.chosen.to_dict()}


@dataclass(frozen=True)
class Plan:
    """Candidates ordered fitting first, fastest first; `chosen` is the first, or None."""

    spec: PlanSpec
    candidates: tuple[Candidate, ...]
    chosen: Candidate | None
    suggestions: tuple[Suggestion, ...] = ()
    notes: tuple[str, ...] = ()
    """What was left out of the candidates, and why."""
    why: tuple[str, ...] = ()
    """For the chosen configuration: what each optimization it enables saves."""

    def refusal(self) -> str | None:
        """Why a job with this plan must be refused, naming the nearest fit; None when it fits."""
        if self.chosen is not None:
            return None
        least = min(self.candidates, key=lambda c: c.memory.total)
        message = (f"predicted not to fit: the leanest configuration ({least.config.describe()}) "
                   f"needs {least.memory.total:.1f} GB per GPU of {self.spec.gpu_memory_gb:g} GB")
        if self.suggestions:
            return f"{message}; nearest that fits: {self.suggestions[0].message}"
        return f"{message}; no single change found that fits: use larger GPUs"

    def to_dict(self) -> dict[str, Any]:
        """The wire object: `{"model", "chosen", "why", "candidates", "suggestions", "notes"}`."""
        spec = self.spec
        model = {**spec.architecture.summary(), "method": spec.method,
                 "trainable_parameters": spec.trainable_parameters}
        return {"model": model, "chosen": self.chosen.to_dict() if self.chosen else None,
                "why": list(self.why), "candidates": [c.to_dict() for c in self.candidates],
                "suggestions": [s.to_dict() for s in self.suggestions], "notes": list(self.notes),
                "serving": serving_plan(spec)}


def serving_plan(spec: PlanSpec) -> dict[str, Any]:
    """The model server for the job's result on one such GPU (or CPU node), at the serving
    settings' defaults: its memory term by term (GB), the KV cache's tokens, and whether the base
    fits the server's share of the device (eft/planner/serving.py)."""
    gpu = spec.device != "cpu"
    utilization = 0.85
    try:
        memory = serving_memory(spec.architecture, gpu, device_gb=spec.gpu_memory_gb * 1e9 / GIB,
                                gpu_memory_utilization=utilization, max_lora_rank=max(64, spec.lora_r))
    except PlannerError as exc:
        return {"fits": False, "reason": str(exc), "gpu_memory_utilization": utilization if gpu else None}
    terms = {name: round(getattr(memory, name) / 1e9, 3)
             for name in ("weights", "lora_slots", "activations", "kv_cache", "context", "total")}
    return {"fits": True, "reason": "", "gpu_memory_utilization": utilization if gpu else None,
            "memory_gb": terms, "kv_tokens": memory.kv_tokens}


def configurations(spec: PlanSpec) -> tuple[tuple[Configuration, ...], tuple[str, ...]]:
    """Every configuration the spec allows on its GPU, and notes on what was left out."""
    notes = []
    attentions = spec.attentions
    if "flash_attention_2" in attentions:
        flash = supports_flash_attention(spec.gpu_type)
        if not flash:
            attentions = tuple(a for a in attentions if a != "flash_attention_2")
            why = ("gpu type not given" if spec.gpu_type is None else
                   f"{spec.gpu_type} does not support it" if flash is False else
                   f"gpu type {spec.gpu_type!r} is not one the planner knows")
            notes.append(f"flash_attention_2 not considered: {why} (it needs an Ampere or newer "
                         "GPU; give the gpu type, e.g. A100 or H100, to consider it)")
    if not attentions:
        attentions = ("sdpa",)
    configs = tuple(
        Configuration(strategy, offload, checkpointing, attention)
        for strategy in STRATEGIES if strategy in spec.strategies
        for offload in OFFLOADS_BY_STRATEGY[strategy] if offload in spec.offloads
        for checkpointing in spec.gradient_checkpointing
        for attention in attentions
    )
    return configs, tuple(notes)


def _rank(candidate: Candidate, workers: int) -> tuple:
    c = candidate.config
    # Ties go to the simplest strategy: DDP runs as fast as ZeRO-1 (the same bytes move) and starts
    # without DeepSpeed's engine and its communication op (compiled on first use where it was
    # not prebuilt), so where it fits it is chosen; ZeRO-1 is chosen where only it fits.
    del workers
    preference = -1 if c.strategy == "ddp" else STRATEGY_PREFERENCE.index(c.strategy)
    return (not candidate.fits, round(candidate.relative_time, 6), preference, candidate.memory.total)


def _evaluate(spec: PlanSpec) -> tuple[list[Candidate], tuple[str, ...]]:
    configs, notes = configurations(spec)
    candidates = []
    for config in configs:
        memory = estimate_memory(spec, config)
        candidates.append(Candidate(config, memory, memory.total <= spec.gpu_memory_gb,
                                    relative_time(config)))
    candidates.sort(key=lambda c: _rank(c, spec.gpus))
    return candidates, notes


def _choose(spec: PlanSpec) -> Candidate | None:
    candidates, _ = _evaluate(spec)
    return candidates[0] if candidates and candidates[0].fits else None


def _reason(candidate: Candidate, chosen: Candidate | None, faster_rejected: list[Candidate],
            capacity: float) -> str:
    memory, time = candidate.memory, candidate.relative_time
    if candidate is chosen:
        text = f"chosen: the fastest configuration that fits ({memory.total:.1f} of {capacity:g} GB)"
        if faster_rejected:
            closest = min(faster_rejected, key=lambda c: c.memory.total)
            term, size = closest.memory.largest_term()
            text += (f"; the {len(faster_rejected)} faster ones do not fit, the closest, "
                     f"{closest.config.describe()}, needs {closest.memory.total:.1f} GB "
                     f"({term} {size:.1f} GB)")
        return text
    if candidate.fits:
        assert chosen is not None
        slower = (time / chosen.relative_time - 1) * 100
        return (f"fits ({memory.total:.1f} of {capacity:g} GB) but {slower:.0f}% slower "
                "than the chosen one")
    term, size = memory.largest_term()
    return (f"does not fit: needs {memory.total:.1f} GB of {capacity:g} GB "
            f"({memory.total - capacity:.1f} GB over; largest term {term} {size:.1f} GB)")


# The strategy one step less sharded, to show what the chosen one's sharding buys.
_LESS_SHARDED = {"zero3": "zero2", "zero2": "zero1", "fsdp": "ddp"}


def _explain(spec: PlanSpec, chosen: Candidate) -> tuple[str, ...]:
    """One line per optimization the chosen configuration enables: what it costs without it."""
    config, lines = chosen.config, []

    def without(label: str, cost: str, **change: Any) -> None:
        other = replace(config, **change)
        memory = estimate_memory(spec, other)
        verdict = "does not fit" if memory.total > spec.gpu_memory_gb else "would fit"
        term, size = memory.largest_term()
        lines.append(f"{label} ({cost}): without it, {other.describe()} needs {memory.total:.1f} GB "
                     f"({term} {size:.1f} GB) and {verdict} in {spec.gpu_memory_gb:g} GB")

    if config.strategy in _LESS_SHARDED:
        lesser = _LESS_SHARDED[config.strategy]
        offload = config.offload if config.offload in OFFLOADS_BY_STRATEGY[lesser] else "none"
        without(config.strategy, "shards more state, costs communication", strategy=lesser,
                offload=offload)
    if config.offload != "none":
        without(f"offload {config.offload}", "host memory, costs PCIe time", offload="none")
    if config.gradient_checkpointing:
        without("gradient checkpointing", "recomputes activations, about 25% more time",
                gradient_checkpointing=False)
    return tuple(lines)


def plan(spec: PlanSpec) -> Plan:
    """Evaluate every candidate for `spec` and choose the fastest that fits.

    Returns a Plan whose candidates each carry a reason; when nothing fits, `chosen` is None and
    `suggestions` lists the nearest changes that fit. Raises PlannerError for an unusable spec.
    A plan is a function of its (frozen) spec: the same spec's plan is computed once (the
    service plans every create, and most repeat an earlier job's model, method and cluster).
    """
    return _plan(spec)


@functools.lru_cache(maxsize=256)
def _plan(spec: PlanSpec) -> Plan:
    candidates, notes = _evaluate(spec)
    chosen = candidates[0] if candidates and candidates[0].fits else None
    faster_rejected = sorted((c for c in candidates if not c.fits
                              and chosen is not None and c.relative_time < chosen.relative_time),
                             key=lambda c: (c.relative_time, c.memory.total))
    reasoned = [replace(c, reason=_reason(c, chosen, faster_rejected, spec.gpu_memory_gb))
                for c in candidates]
    chosen = reasoned[0] if chosen is not None else None
    if chosen is None:
        return Plan(spec, tuple(reasoned), None, nearest_fit(spec), notes)
    return Plan(spec, tuple(reasoned), chosen, (), notes, _explain(spec, chosen))


def _largest_fitting(spec: PlanSpec, field: str, low: int, high: int) -> tuple[int, Candidate] | None:
    """The largest value of `field` in [low, high] for which something fits (memory grows with
    it), with the configuration chosen there; None when even `low` does not fit."""
    best = None
    while low <= high:
        middle = (low + high) // 2
        chosen = _choose(replace(spec, **{field: middle}))
        if chosen is not None:
            best, low = (middle, chosen), middle + 1
        else:
            high = middle - 1
    return best


def _fewest_gpus(spec: PlanSpec) -> tuple[int, Candidate] | None:
    """The smallest GPU count above the spec's for which something fits (sharded terms shrink
    with it), searching by doubling and then bisecting; None up to MAX_GPUS."""
    low, high = spec.gpus, spec.gpus
    while True:
        if high >= MAX_GPUS:
            return None
        high = min(high * 2, MAX_GPUS)
        if _choose(replace(spec, gpus=high)) is not None:
            break
        low = high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _choose(replace(spec, gpus=middle)) else (middle, high)
    return high, _choose(replace(spec, gpus=high))  # type: ignore[return-value]


def _round_seq_len(value: int) -> int:
    return value - value % 128 if value >= 256 else value


def nearest_fit(spec: PlanSpec) -> tuple[Suggestion, ...]:
    """Changes that make some configuration fit when none does, nearest first: let the planner
    pick the strategy (when one was forced) or offload (when it was ruled out), a smaller micro
    batch, more GPUs, a lighter method (LoRA, QLoRA), a shorter sequence. ZeRO-3, offload and
    checkpointing are candidates already, so each suggestion's `chosen` names the ones it needs.
    Empty when something fits."""
    if _choose(spec) is not None:
        return ()
    found: list[Suggestion] = []

    def add(change: str, value: str | int, what: str, chosen: Candidate | None) -> None:
        if chosen is not None:
            found.append(Suggestion(change, value, f"{what}: {chosen.config.describe()} needs "
                                    f"{chosen.memory.total:.1f} of {spec.gpu_memory_gb:g} GB", chosen))

    if set(spec.strategies) != set(STRATEGIES):
        add("strategy", "auto", "let the planner choose the strategy (auto)",
            _choose(replace(spec, strategies=STRATEGIES)))
    if set(spec.offloads) != set(OFFLOADS):
        add("offload", "allowed", "allow CPU offload", _choose(replace(spec, offloads=OFFLOADS)))
    if spec.micro_batch > 1 and (hit := _largest_fitting(spec, "micro_batch", 1, spec.micro_batch - 1)):
        add("micro_batch", hit[0], f"micro batch {hit[0]} instead of {spec.micro_batch} "
            "(raise gradient accumulation to keep the global batch)", hit[1])
    if hit := _fewest_gpus(spec):
        add("gpus", hit[0], f"{hit[0]} GPUs instead of {spec.gpus}", hit[1])
    for method in {"full": ("lora", "qlora"), "lora": ("qlora",)}.get(spec.method, ()):
        add("method", method, f"method {method} instead of {spec.method}",
            _choose(replace(spec, method=method)))
    if spec.seq_len > 1 and (hit := _largest_fitting(spec, "seq_len", 1, spec.seq_len - 1)):
        shorter = _round_seq_len(hit[0])
        add("seq_len", shorter, f"sequences of {shorter} tokens instead of {spec.seq_len}",
            _choose(replace(spec, seq_len=shorter)))
    return tuple(found)
