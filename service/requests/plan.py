"""Stage 3 of a job request: plan it. The request's forced options stay; the planner
(`eft/planner`) picks the rest, the fastest configuration predicted to fit its workers' memory,
and a job that fits nowhere is refused with the nearest configuration that would fit.

`POST /plan` asks the same question without a job: model names resolve to the closed registry
or to a config.json under the allowed model roots (`Settings.allowed_model_roots`), never to an
arbitrary path. The pure planner (`eft.planner`) does not import this module, so the CLI stays light.

    spec = spec_for_request(job_create, cluster, settings)   # raises RequestInvalid
    refuse_unless_fits(plan(spec))                            # raises RequestInvalid naming a fit
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from eft.planner.architectures import (
    KNOWN_ARCHITECTURES,
    Architecture,
    PlannerError,
    architecture_from_config,
    known_architecture,
)
from eft.planner.planning import Plan
from eft.planner.spec import PlanSpec
from eft.service.errors import Problem, RequestInvalid
from eft.service.requests import hub
from eft.service.requests.model_support import ModelSupport, inspect_model
from eft.service.requests.paths import HUB_ID, resolve_under_roots
from eft.service.settings import Settings
from eft.types.jobs import JobCreate
from eft.types.plans import Cluster


#: PlanSpec fields -> the request field a problem with them is reported against.
REQUEST_PARAMS = {
    "model": "model", "method": "method.type", "lora_r": "method.r",
    "lora_targets": "method.target_modules", "seq_len": "hyperparameters.max_seq_len",
    "micro_batch": "hyperparameters.micro_batch_size", "gpus": "cluster.gpus",
    "gpu_memory_gb": "cluster.gpu_memory_gb", "strategies": "strategy",
}

#: What a suggestion changes -> the request field a refusal is reported against.
SUGGESTION_PARAMS = {
    "strategy": "strategy", "offload": "strategy", "micro_batch": "hyperparameters.micro_batch_size",
    "gpus": "scaling.min_workers", "method": "method.type", "seq_len": "hyperparameters.max_seq_len",
}


def resolve_architecture(model: str, settings: Settings, path: Path | None = None) -> Architecture:
    """The architecture `model` names: a registered name, or a model directory (or its
    config.json) under an allowed model root, or a hub id's snapshot; `path` when the caller
    has resolved the model already. Raises RequestInvalid (param "model")."""
    known = known_architecture(model) if path is None else None
    if known is not None:
        return known
    roots = settings.allowed_model_roots
    path = path or resolve_under_roots(model, roots)
    if path is None and settings.allow_hub_models and HUB_ID.match(model):
        path, problem = hub.snapshot(model, settings)
        if problem is not None:
            raise RequestInvalid(problems=[problem])
    if path is not None and ((path.is_file() and path.suffix == ".json")
                             or (path / "config.json").is_file()):
        try:
            arch = architecture_from_config(path, name=model)
        except PlannerError as exc:
            raise RequestInvalid(problems=[Problem("model", "model_config_invalid", str(exc))]) from None
        if path.is_dir():
            # The model's own layer modules and exact size (names LoRA targets must use).
            support = inspect_model(str(path))
            arch = dataclasses.replace(arch, linears=support.linears, num_parameters=support.parameters)
        return arch
    raise RequestInvalid(problems=[Problem(
        "model", "model_not_found",
        f"unknown model {model!r}: name a known architecture ({', '.join(KNOWN_ARCHITECTURES)}) or "
        f"a model directory with a config.json under an allowed model root "
        f"({', '.join(str(r) for r in roots)})",
    )])


def spec_for_request(request: JobCreate, cluster: Cluster, settings: Settings,
                     model_path: str | None = None) -> PlanSpec:
    """The planning question a job request asks on `cluster` (of the model at `model_path` when
    the caller resolved it). A forced strategy is the only one considered; "auto" considers all.
    Raises RequestInvalid naming the request field at fault."""
    arch = resolve_architecture(request.model, settings, Path(model_path) if model_path else None)
    try:
        return PlanSpec.from_request(request, cluster, arch)
    except PlannerError as exc:
        param = REQUEST_PARAMS.get(exc.param, exc.param)
        raise RequestInvalid(problems=[Problem(param, "plan_invalid", str(exc))]) from None


def refuse_unless_fits(result: Plan) -> None:
    """Raise RequestInvalid (a 422, code does_not_fit) when nothing in `result` fits; its message
    names the nearest configuration that would (more GPUs, ZeRO-3, offload, checkpointing, QLoRA,
    shorter sequences)."""
    message = result.refusal()
    if message is None:
        return
    param = "strategy" if len(result.spec.strategies) == 1 else "hyperparameters.max_seq_len"
    if result.suggestions:
        param = SUGGESTION_PARAMS[result.suggestions[0].change]
    raise RequestInvalid(problems=[Problem(param, "does_not_fit", message)])

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
