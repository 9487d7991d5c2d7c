"""Stage 2 of a job request: check it whole on the request path. Names resolve (`resolve.py`),
files parse against their schema, options agree with each other, with the hardware and with the
model's architecture, chat records render under the model's template (`templates.py`), and the
job is planned (`plan.py`). Every problem is collected and raised together as one RequestInvalid
(a 422); nothing is stored for such a request."""

from __future__ import annotations

from dataclasses import dataclass
import importlib.util
from pathlib import Path
from typing import Any

from eft.service.errors import Problem, RequestInvalid
from eft.service.requests.model_support import ModelSupport, inspect_model
from eft.service.requests.plan import QLORA_STRATEGIES, Choice, choose_configuration
from eft.service.requests.resolve import resolve_dataset, resolve_model, scan_cached
from eft.service.requests.templates import check_chat_template
from eft.service.settings import Settings
from eft.types.jobs import JobCreate


@dataclass(frozen=True)
class ResolvedInputs:
    model_path: str
    training_file: Path
    validation_file: Path | None
    choice: Choice


def check_request(req: JobCreate, settings: Settings, choice: Choice | None = None) -> ResolvedInputs:
    """Every check that needs no tokenizer, and the plan (`choice` when the job already has
    one). Returns resolved inputs; raises RequestInvalid."""
    problems: list[Problem] = []
    model_path = resolve_model(req.model, settings, problems)
    columns = req.data.columns
    train = resolve_dataset(req.training_file, "training_file", settings, problems, columns)
    valid = None
    if req.validation_file:
        valid = resolve_dataset(req.validation_file, "validation_file", settings, problems, columns)
    if req.tuning.type == "qlora" and req.strategy not in QLORA_STRATEGIES:
        problems.append(Problem("strategy", "strategy_unsupported_for_method",
                                f"qlora runs with strategy ddp (or auto) in this build, not "
                                f"{req.strategy!r}: set strategy to ddp"))
    for name in req.scaling.resources:
        if name not in settings.allowed_worker_resources:
            allowed = ", ".join(settings.allowed_worker_resources) or "none"
            problems.append(Problem(f"scaling.resources.{name}", "resource_not_allowed",
                                    f"custom resource {name!r} is not one this server lets jobs ask for "
                                    f"(allowed: {allowed}): drop it, or ask the operator to add it to "
                                    "EFT_ALLOWED_WORKER_RESOURCES"))
    max_workers = req.scaling.resolved_max_workers
    if req.hyperparameters.global_batch_size < max_workers:
        problems.append(Problem("hyperparameters.global_batch_size", "batch_smaller_than_workers",
                                f"global_batch_size ({req.hyperparameters.global_batch_size}) is "
                                f"below max_workers ({max_workers}): every worker needs an example "
                                "per step; raise global_batch_size or lower max_workers"))
    problems += check_optimizations(req)
    problems += check_evaluation(req)
    support = None
    if model_path is not None and Path(model_path).is_dir():
        try:
            support = inspect_model(model_path)
        except RequestInvalid as exc:
            problems += exc.problems
    if support is not None:
        problems += check_architecture(req, support)
    if problems:
        raise RequestInvalid(problems=problems)
    assert model_path is not None and train is not None
    choice = choice or choose_configuration(req, settings, support, model_path)
    for param, path in (("training_file", train), ("validation_file", valid)):
        if path is None:
            continue
        formats = scan_cached(path, settings.max_validation_errors, columns).formats
        problems += check_record_kinds(req, param, formats)
        if "chat" in formats or "preference" in formats:
            problems += check_chat_template(model_path, path, param, req)
    if problems:
        raise RequestInvalid(problems=problems)
    return ResolvedInputs(model_path, train, valid, choice)


def check_evaluation(req: JobCreate) -> list[Problem]:
    """Evaluation settings that need what the request does not give."""
    problems = []
    # What the request asks for (a stored request holds every field, its defaults included).
    asked = {name for name in ("every_steps", "early_stopping_patience") if getattr(req.eval, name) is not None}
    asked |= {"min_delta"} if req.eval.min_delta else set()
    if not req.validation_file:
        for name in sorted(asked):
            problems.append(Problem(f"eval.{name}", "validation_file_required",
                                    f"eval.{name} needs a validation_file to evaluate on: add one, or drop eval.{name}"))
        if req.publish == "best":
            problems.append(Problem("publish", "validation_file_required",
                                    "publish 'best' picks the step with the lowest validation loss: add a "
                                    "validation_file, or publish 'last'"))
    if req.publish == "best" and req.tuning.type == "full":
        problems.append(Problem("publish", "publish_best_unsupported",
                                "publish 'best' keeps the best weights in memory while training goes on, "
                                "which a full fine-tuning job's are too large for: publish 'last', or pick "
                                "the best checkpoint (GET /jobs/{id}/checkpoints marks it) and download it"))
    return problems


def check_record_kinds(req: JobCreate, param: str, formats: dict[str, int]) -> list[Problem]:
    """A DPO job trains on preference pairs only; any other job on anything but them."""
    if req.objective == "dpo" and set(formats) - {"preference"}:
        other = ", ".join(sorted(set(formats) - {"preference"}))
        return [Problem(param, "preference_records_required",
                        f"a DPO job trains on preference pairs, but this file holds {other} records: give "
                        '{"input": {"messages": [...]}, "preferred_output": [{"role": "assistant", ...}], '
                        '"non_preferred_output": [...]} records, or train it with method lora, qlora or full')]
    if req.objective != "dpo" and "preference" in formats:
        return [Problem(param, "preference_records_need_dpo",
                        f"this file holds {formats['preference']} preference pairs (preferred_output / "
                        'non_preferred_output): train them with method {"type": "dpo"}, or give chat, '
                        "prompt/completion or text records")]
    return []


def check_optimizations(req: JobCreate) -> list[Problem]:
    """Options that cannot work together, or not on this hardware."""
    opt, strategy, problems = req.optimizations, req.strategy, []
    if opt.attention == "flash_attention_2":
        if not req.scaling.use_gpu:
            problems.append(Problem("optimizations.attention", "needs_gpu",
                                    "flash_attention_2 runs on GPUs only: set scaling.use_gpu or use sdpa"))
        elif importlib.util.find_spec("flash_attn") is None:
            problems.append(Problem("optimizations.attention", "not_installed",
                                    "flash_attention_2 needs the flash-attn package on the workers: "
                                    "install it or use sdpa"))
    if opt.precision == "fp16" and not req.scaling.use_gpu and strategy not in ("auto", "ddp"):
        problems.append(Problem("optimizations.precision", "fp16_needs_gpu",
                                f"fp16 with {strategy} needs GPUs; on CPU use bf16, or fp16 with ddp"))
    if opt.offload not in ("auto", "none") and strategy == "ddp":
        problems.append(Problem("optimizations.offload", "offload_needs_sharding",
                                "ddp keeps every state on the device: use zero1-3 or fsdp to offload"))
    if opt.offload == "optimizer+params" and strategy in ("zero1", "zero2"):
        problems.append(Problem("optimizations.offload", "params_offload_needs_zero3",
                                "parameter offload needs zero3 or fsdp: use offload 'optimizer' or strategy zero3"))
    return problems


def check_architecture(req: JobCreate, support: ModelSupport) -> list[Problem]:
    """Options this architecture cannot honour."""
    problems = []
    opt = req.optimizations
    if opt.attention not in ("auto", *support.attentions):
        problems.append(Problem("optimizations.attention", "attention_unsupported",
                                f"{support.architecture} does not support {opt.attention!r} attention: "
                                f"use one of {', '.join(support.attentions)} (or auto)"))
    if opt.packing and not support.packing:
        problems.append(Problem("optimizations.packing", "packing_inexact",
                                f"{support.architecture} takes positions from the attention mask, so "
                                "examples packed in one row would attend to each other: set packing "
                                "to false, or leave it unset to pad on this architecture"))
    return problems


def check_raw_inputs(body: dict[str, Any], settings: Settings) -> list[Problem]:
    """Problems with the model and files a body names, for a body that failed schema checks
    elsewhere: the user then hears about every problem in one response."""
    problems: list[Problem] = []
    if isinstance(body.get("model"), str) and body["model"]:
        resolve_model(body["model"], settings, problems)
    for param in ("training_file", "validation_file"):
        if isinstance(body.get(param), str) and body[param]:
            resolve_dataset(body[param], param, settings, problems)
    return problems
