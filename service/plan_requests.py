"""From a request (POST /plan, or a job request plus cluster facts) to a `PlanSpec`, and back to 422s.

Server-side only: model names resolve to the closed registry or to a config.json under the
allowed model roots (`Settings.allowed_model_roots`), never to an arbitrary path. The pure planner
(`service.planner`) does not import this module, so the CLI stays light.

    spec = spec_for_request(job_create, cluster, settings)   # raises RequestInvalid
    refuse_unless_fits(plan(spec))                            # raises RequestInvalid naming a fit
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from eft.types.jobs import JobCreate
from eft.types.plans import Cluster
from eft.service.errors import Problem, RequestInvalid
from eft.planner.architectures import (
    KNOWN_ARCHITECTURES,
    Architecture,
    PlannerError,
    architecture_from_config,
    known_architecture,
)
from eft.planner.planning import Plan
from eft.planner.spec import PlanSpec
from eft.service.model_support import inspect_model
from eft.service.settings import Settings
from eft.service import hub
from eft.service.paths import HUB_ID, resolve_under_roots

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
