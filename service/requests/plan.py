"""Stage 3 of a job request: plan it. The request's forced options stay; the planner
(`eft/planner`) picks the rest, the fastest configuration predicted to fit its workers' memory,
and a job that fits nowhere is refused with the nearest configuration that would fit."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from eft.service.model_support import ModelSupport
from eft.service.plan_requests import refuse_unless_fits, spec_for_request
from eft.service.settings import Settings
from eft.types.jobs import JobCreate
from eft.types.plans import Cluster


#: The strategies QLoRA runs with: 4-bit base weights are not sharded by the others yet.
QLORA_STRATEGIES = ("auto", "ddp")


@dataclass(frozen=True)
class Choice:
    """The configuration a job runs with: the request's forced options, the planner's for the rest."""

    strategy: str
    offload: str
    gradient_checkpointing: bool
    attention: str
    precision: str
    predicted_memory_gb: float
    #: Examples packed into rows (exact on this architecture) or padded per micro-batch.
    packing: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Choice:
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


def _cluster_for(req: JobCreate, settings: Settings) -> Cluster:
    workers = req.scaling.resolved_max_workers
    if req.scaling.use_gpu:
        return Cluster(gpus=workers, gpu_memory_gb=settings.gpu_memory_gb, gpu_type=settings.gpu_type)
    # On CPU a worker's "device memory" is its share of the host's.
    total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return Cluster(gpus=workers, gpu_memory_gb=settings.cpu_worker_memory_gb or total_gb * 0.8 / workers)


def choose_configuration(req: JobCreate, settings: Settings, support: ModelSupport | None = None,
                         model_path: str | None = None) -> Choice:
    """Plan the job: the request's forced options stay, the planner picks the rest (the fastest
    configuration predicted to fit). Raises RequestInvalid (does_not_fit) naming the nearest
    configuration that would fit."""
    from eft.planner import plan

    opt, gpu = req.optimizations, req.scaling.use_gpu
    spec = spec_for_request(req, _cluster_for(req, settings), settings, model_path)
    precision = opt.precision if opt.precision != "auto" else ("bf16" if gpu else "fp32")
    narrowed: dict[str, Any] = {"precision": precision, "device": "cuda" if gpu else "cpu"}
    if req.tuning.type == "qlora" or (opt.precision == "fp16" and not gpu):
        # 4-bit weights, and fp16 on CPU (GradScaler), run under DDP only.
        narrowed["strategies"] = tuple(s for s in spec.strategies if s in QLORA_STRATEGIES)
    supported = support.attentions if support is not None else spec.attentions
    if opt.attention != "auto":
        narrowed["attentions"] = (opt.attention,)
    elif not gpu:
        narrowed["attentions"] = ("sdpa",) if "sdpa" in supported else ("eager",)
    else:
        narrowed["attentions"] = tuple(a for a in spec.attentions if a in supported) or ("eager",)
    if opt.offload != "auto":
        narrowed["offloads"] = (opt.offload,)
    if opt.gradient_checkpointing is not None:
        narrowed["gradient_checkpointing"] = (opt.gradient_checkpointing,)
    result = plan(dataclasses.replace(spec, **narrowed))
    refuse_unless_fits(result)
    chosen = result.chosen
    assert chosen is not None
    return Choice(
        strategy=chosen.config.strategy, offload=chosen.config.offload,
        gradient_checkpointing=chosen.config.gradient_checkpointing,
        attention=chosen.config.attention, precision=precision,
        predicted_memory_gb=round(chosen.memory.total, 4),
        packing=opt.packing if opt.packing is not None else (support.packing if support else True),
    )
