"""Checks on a job request, and the one function that turns a request into a training config.

Two stages:
- `check_request` runs on the request path: names resolve under the allowed roots, files parse
  line by line against their schema, numbers are consistent. Every problem is collected and
  raised together as one RequestInvalid (a 422), and nothing is stored for such a request.
- `validate_job` runs in the scheduler (validating -> queued): it tokenizes the data with the
  model's tokenizer and fills the training config, raising TrainingUserError for the job to carry.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import importlib.util
import itertools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from eft.types.jobs import JobCreate, LoraMethod
from eft.types.plans import Cluster
from eft.service.errors import Problem, RequestInvalid
from eft.service import hub
from eft.service.files import FILE_ID, uploaded_path
from eft.service.model_support import ComputedOnce, ModelSupport, inspect_model
from eft.service.paths import HUB_ID, resolve_under_roots
from eft.service.plan_requests import refuse_unless_fits, spec_for_request
from eft.service.settings import Settings
from eft.training.config import TrainConfig, steps_for
from eft.training.formats import (
    ScanResult, content_bytes, data_kind, is_dataset_dir, iter_records, scan_jsonl,
)

if TYPE_CHECKING:
    from eft.service.store import JobRecord

URI = re.compile(r"^[a-z][a-z0-9+.-]*://")
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


@dataclass(frozen=True)
class ResolvedInputs:
    model_path: str
    training_file: Path
    validation_file: Path | None
    choice: Choice


def _roots_hint(roots: list[Path]) -> str:
    return ", ".join(str(r) for r in roots)


def resolve_model(value: str, settings: Settings, problems: list[Problem]) -> str | None:
    roots = settings.allowed_model_roots
    path = resolve_under_roots(value, roots)
    if path is not None and (path / "config.json").is_file():
        return str(path)
    if settings.allow_hub_models and HUB_ID.match(value) and not Path(value).is_absolute():
        snapshot, problem = hub.snapshot(value, settings)
        if problem is not None:
            problems.append(problem)
            return None
        return str(snapshot)
    bundled = sorted(
        p.parent.name for r in roots if r.is_dir() for p in r.glob("*/config.json")
    )
    problems.append(Problem(
        "model", "model_not_found",
        f"unknown model {value!r}: name a bundled model ({', '.join(bundled) or 'none built'}) or "
        f"a Hugging Face model directory under an allowed model root ({_roots_hint(roots)})",
    ))
    return None


def resolve_dataset(value: str, param: str, settings: Settings, problems: list[Problem],
                    columns: dict[str, str] | None = None) -> Path | None:
    """Resolve and fully scan one dataset (JSONL, Parquet, CSV file or `datasets` directory);
    every problem found is appended."""
    roots = settings.allowed_data_roots
    if value.startswith("hf://datasets/") and settings.allow_hub_models:
        path, problem = hub.dataset_file(value, param, settings)
        if problem is not None:
            problems.append(problem)
            return None
    elif URI.match(value):
        problems.append(Problem(param, "unsupported_uri", "remote URIs are not enabled on this "
                                "server: upload the file under an allowed data root"
                                + ("" if settings.allow_hub_models else
                                   " (hf://datasets/... needs EFT_ALLOW_HUB_MODELS=true)")))
        return None
    elif FILE_ID.match(value):
        path = uploaded_path(value, settings)
        path = path if path.exists() else None
    else:
        path = resolve_under_roots(value, roots)
    if path is None:
        problems.append(Problem(param, "file_not_found",
                                f"{value!r} is not a file under an allowed data root "
                                f"({_roots_hint(roots)}): check the path"))
        return None
    if path.is_dir() and not is_dataset_dir(path):
        problems.append(Problem(param, "not_a_file", f"{value!r} is a directory but not a `datasets` "
                                "save_to_disk directory: name a JSONL, Parquet or CSV file, or such a directory"))
        return None
    if content_bytes(path) > settings.max_dataset_bytes:
        problems.append(Problem(param, "file_too_large",
                                f"{value!r} exceeds {settings.max_dataset_bytes} bytes"))
        return None
    try:
        scan = scan_cached(path, settings.max_validation_errors, columns)
    except RequestInvalid as exc:  # the scan passed its helper's limits: this field's input
        problems.extend(Problem(param, p.code, p.message) for p in exc.problems)
        return None
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        kind = {"parquet": "Parquet", "csv": "UTF-8 CSV", "arrow": "a `datasets` directory"}.get(
            data_kind(path), "UTF-8 JSONL")
        problems.append(Problem(param, "file_unreadable", f"cannot read {value!r} as {kind}: {exc}"))
        return None
    for p in scan.problems:
        problems.append(Problem(f"{param}:line {p.line}:{p.field}", "invalid_record",
                                f"{path.name} line {p.line}: {p.field} {p.message}"))
    if scan.problems_total > len(scan.problems):
        problems.append(Problem(param, "more_problems",
                                f"{scan.problems_total - len(scan.problems)} more problem(s) not listed"))
    if scan.records == 0:
        problems.append(Problem(param, "empty_file", f"{value!r} has no records"))
    return path if not scan.problems_total and scan.records else None


def scan_cached(path: Path, max_problems: int, columns: dict[str, str] | None = None) -> ScanResult:
    """`scan_jsonl`, remembered while the file is unchanged (same inode, size and mtime; for a
    directory, of its newest file): jobs that reuse a dataset are checked once, on the request
    path and in the scheduler alike."""
    stats = [p.stat() for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path.stat()]
    key = (len(stats), sum(st.st_size for st in stats), max((st.st_mtime_ns for st in stats), default=0))
    st = path.stat()
    return _scan(str(path.resolve()), st.st_ino, key, max_problems, tuple(sorted((columns or {}).items())))


@functools.lru_cache(maxsize=64)
def _scan(path: str, _ino: int, _key: tuple[int, int, int], max_problems: int,
          columns: tuple[tuple[str, str], ...]) -> ScanResult:
    from eft.service import isolation

    # In a helper process: a scan of a large file must not hold this replica's interpreter.
    return isolation.run(scan_jsonl, Path(path), max_problems, dict(columns))


def _tokenizer_signature(model_path: str) -> tuple[tuple[str, int, int], ...]:
    """What identifies a tokenizer's files on disk (empty for a name that is not a directory)."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")
    files = [Path(model_path) / n for n in names]
    return tuple((f.name, (st := f.stat()).st_size, st.st_mtime_ns) for f in files if f.is_file())


@functools.lru_cache(maxsize=8)
def _tokenizer(model_path: str, _signature: tuple[tuple[str, int, int], ...]) -> Any:
    """The model's tokenizer, loaded once per model directory while its files are unchanged.
    Used by the scheduler's thread only (a fast tokenizer is not safe to share across threads
    that change its truncation settings)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


#: Chat records rendered through the model's template on the request path: a template that
#: refuses the data's shape (no system role, strict alternation, no template) is a 422 at once.
TEMPLATE_SAMPLE = 32
_request_tokenizer_lock = threading.Lock()


@contextlib.contextmanager
def request_tokenizer(model_path: str) -> Iterator[Any]:
    """The model's tokenizer for request handlers (which run on many threads): loaded once per
    directory while its files are unchanged, and used by one thread at a time."""
    tokenizer = _request_tokenizer(model_path, _tokenizer_signature(model_path))
    with _request_tokenizer_lock:
        yield tokenizer


def _load_request_tokenizer(model_path: str, _signature: tuple[tuple[str, int, int], ...]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


#: Loaded by one thread at a time (transformers' lazy imports), looked up without a lock.
_request_tokenizer = ComputedOnce(_load_request_tokenizer, maxsize=8)


def tokenizer_problem(model_path: str) -> Problem | None:
    """Why the model's tokenizer cannot load (then loaded and cached for `request_tokenizer`)."""
    try:
        _request_tokenizer(model_path, _tokenizer_signature(model_path))
    except Exception as exc:  # noqa: BLE001 - any reason a tokenizer cannot load is the model's
        return Problem("model", "tokenizer_unavailable",
                       f"cannot load the model's tokenizer ({type(exc).__name__}: {str(exc)[:300]}): "
                       "a model directory needs its tokenizer files (tokenizer.json, "
                       "tokenizer_config.json) to train on chat records")
    return None


def check_chat_template(model_path: str, path: Path, param: str, req: JobCreate) -> list[Problem]:
    """The first chat records of a file rendered and masked with the model's own template.

    Remembered per file version, tokenizer files and options: rendering is most of a create's
    CPU, and jobs are created again and again on the same file and model."""
    try:
        stat = path.stat()
    except OSError:
        stat = None
    if stat is None:
        return _check_chat_template(model_path, path, param, req.data.train_on, req.data.system_message,
                                    tuple(sorted(req.data.columns.items())))
    return list(_checked_chat_template(model_path, _tokenizer_signature(model_path), str(path),
                                       (stat.st_size, stat.st_mtime_ns, stat.st_ino), param, req.data.train_on,
                                       req.data.system_message, tuple(sorted(req.data.columns.items()))))


@functools.lru_cache(maxsize=256)
def _checked_chat_template(model_path: str, _signature: Any, path: str, _version: tuple[int, int, int], param: str,
                           train_on: str, system_message: str, columns: tuple[tuple[str, str], ...]) -> tuple[Problem, ...]:
    return tuple(_check_chat_template(model_path, Path(path), param, train_on, system_message, columns))


def _check_chat_template(model_path: str, path: Path, param: str, train_on: str, system_message: str,
                         columns: tuple[tuple[str, str], ...]) -> list[Problem]:
    """`_render_chat_sample` in the model helper (service/isolation.py): a tokenizer and its
    template need transformers, which the API's process does not import."""
    from eft.service import isolation

    return isolation.run(_render_chat_sample, model_path, path, param, train_on, system_message, columns,
                         pool="model", param=param)


def _render_chat_sample(model_path: str, path: Path, param: str, train_on: str, system_message: str,
                        columns: tuple[tuple[str, str], ...]) -> list[Problem]:
    from eft.training.chat import TemplateError, tokenize_chat
    from eft.training.data import tokenize_preference
    from eft.training.formats import check_record, is_preference

    unavailable = tokenizer_problem(model_path)
    if unavailable is not None:
        return [unavailable]
    with request_tokenizer(model_path) as tokenizer:
        for lineno, record, error in itertools.islice(iter_records(path, columns=dict(columns)), TEMPLATE_SAMPLE):
            if error or not isinstance(record, dict):
                continue
            try:
                if is_preference(record):
                    if not check_record(record)[1]:
                        tokenize_preference(tokenizer, record, 1 << 30, system_message)
                elif "messages" in record:
                    tokenize_chat(tokenizer, record["messages"], record.get("tools"), train_on, system_message)
            except TemplateError as exc:
                return [Problem(f"{param}:line {lineno}:{exc.field}", f"chat_{exc.rule}",
                                f"{path.name} line {lineno}: {exc}")]
    return []


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


def token_cache_dir(settings: Settings) -> Path:
    """Where tokenised datasets are cached (validation fills it, the workers read it)."""
    return settings.home / "cache" / "tokens"


def build_train_config(
    job_id: str, req: JobCreate, inputs: ResolvedInputs, num_train_examples: int, settings: Settings,
    init: dict[str, Any] | None = None,
) -> TrainConfig:
    """The one conversion from a request to a training config, with server defaults filled.
    `init`: the checkpoint a continued job starts from (service/jobs.py:resolve_continuation)."""
    hp, method = req.hyperparameters, req.tuning
    lora = None
    if isinstance(method, LoraMethod):
        target = method.target_modules if isinstance(method.target_modules, str) else tuple(method.target_modules)
        lora = inspect_model(inputs.model_path).lora_spec(
            target, r=method.r, alpha=method.alpha, dropout=method.dropout,
            quant_type=getattr(method, "quant_type", None),
            double_quant=getattr(method, "double_quant", True),
            quant_bits=getattr(method, "bits", 4),
        )
    total_steps = hp.max_steps or steps_for(num_train_examples, hp.global_batch_size, hp.epochs or 1.0)
    init = init or {}
    if init.get("optimizer"):  # the run goes on: its steps come after the source's
        total_steps += int(init["step"])
    return TrainConfig(
        job_id=job_id, model_path=inputs.model_path, training_file=str(inputs.training_file),
        validation_file=str(inputs.validation_file) if inputs.validation_file else None,
        method=method.type, lora=lora, total_steps=total_steps, objective=req.objective,
        dpo_beta=req.method.beta if req.objective == "dpo" else 0.1,
        num_train_examples=num_train_examples, learning_rate=hp.learning_rate,
        lr_scheduler=hp.lr_scheduler, warmup_steps=hp.warmup_steps, weight_decay=hp.weight_decay,
        max_grad_norm=hp.max_grad_norm, global_batch_size=hp.global_batch_size,
        micro_batch_size=hp.micro_batch_size, max_seq_len=hp.max_seq_len, seed=hp.seed,
        train_on=req.data.train_on, system_message=req.data.system_message,
        data_columns=dict(req.data.columns),
        log_every_steps=hp.log_every_steps, min_workers=req.scaling.min_workers,
        max_workers=req.scaling.resolved_max_workers, use_gpu=req.scaling.use_gpu,
        cpus_per_worker=req.scaling.cpus_per_worker, resources_per_worker=dict(req.scaling.resources),
        strategy=inputs.choice.strategy, offload=inputs.choice.offload,
        gradient_checkpointing=inputs.choice.gradient_checkpointing,
        attention=inputs.choice.attention, precision=inputs.choice.precision,
        predicted_memory_gb=inputs.choice.predicted_memory_gb,
        packing=inputs.choice.packing, compile=req.optimizations.compile,
        data_cache_dir=str(token_cache_dir(settings)),
        checkpoint_every_steps=req.checkpoint.every_steps, checkpoint_keep=req.checkpoint.keep,
        eval_every_steps=(req.eval.every_steps or req.checkpoint.every_steps) if inputs.validation_file else 0,
        early_stopping_patience=req.eval.early_stopping_patience or 0,
        early_stopping_min_delta=req.eval.min_delta, eval_sample_prompts=req.eval.sample_prompts,
        eval_sample_tokens=req.eval.sample_max_tokens, publish=req.publish,
        checkpoint_every_seconds=req.checkpoint.every_seconds,
        max_restarts=req.recovery.max_restarts,
        hub=hub.hub_source(inputs.model_path, settings),
        checkpoint_root=settings.resolved_checkpoint_root,
        artifact_root=str(settings.resolved_artifact_root), base_model_name=req.model,
        init_from=init.get("path"), init_optimizer=bool(init.get("optimizer", True)),
        init_job=init.get("job_id"), init_step=int(init.get("step", 0)),
    )


def validate_job(job: JobRecord, settings: Settings) -> tuple[TrainConfig, dict[str, Any]]:
    """Tokenize the job's data and build its training config with the plan made when the job
    was accepted (a job stored without one is planned now).

    Returns (config, stats for the `validated` event). Raises RequestInvalid if the inputs
    changed since the request was accepted, or TrainingUserError for data that cannot train.
    """
    from eft.training.data import DataError
    from eft.training.datacache import load_examples_cached
    from eft.training.errors import TrainingUserError

    req = JobCreate.model_validate(job.request)
    inputs = check_request(req, settings, Choice.from_dict(job.plan) if job.plan else None)
    tokenizer = _tokenizer(str(inputs.model_path), _tokenizer_signature(inputs.model_path))
    options = tokenize_options(req)
    cache = str(token_cache_dir(settings))
    loaded = {}
    for param, path in (("training_file", inputs.training_file), ("validation_file", inputs.validation_file)):
        if path is None:
            continue
        try:
            loaded[param] = load_examples_cached(str(path), tokenizer, options, cache)
        except DataError as exc:
            raise TrainingUserError(f"user_error.{exc.code}", str(exc), param) from None
        data = loaded[param]
        if data.dropped_fraction > req.data.max_dropped_fraction:
            lines = ", ".join(map(str, data.dropped[:5])) + (", ..." if len(data.dropped) > 5 else "")
            raise TrainingUserError(
                "user_error.too_many_dropped", f"{path.name}: {len(data.dropped)} of {data.records} "
                f"records ({data.dropped_fraction:.0%}, lines {lines}) have no trained token within "
                f"max_seq_len={options.max_seq_len}, more than data.max_dropped_fraction="
                f"{req.data.max_dropped_fraction}: raise hyperparameters.max_seq_len, shorten those "
                "prompts, or raise data.max_dropped_fraction", param)
    train = loaded["training_file"]
    valid = loaded["validation_file"].examples if "validation_file" in loaded else []
    lengths = train.lengths
    stats = {
        "train_examples": len(lengths), "validation_examples": len(valid),
        "train_tokens": int(lengths.sum()), "min_tokens": int(lengths.min()), "max_tokens": int(lengths.max()),
        "mean_tokens": round(float(lengths.mean()), 1),
        "truncated_examples": int((lengths >= options.max_seq_len).sum()),
        "loss_tokens": train.loss_tokens,
        "dropped_examples": len(loaded["training_file"].dropped),
        "dropped_lines": loaded["training_file"].dropped[:20],
    }
    init = (job.plan or {}).get("init_from")
    return build_train_config(job.id, req, inputs, len(lengths), settings, init), stats


def _validate_outcome(job: JobRecord, settings: Settings, hub_token: str | None = None) -> tuple[str, Any]:
    """`validate_job` in a helper process, its expected refusals returned as plain data (the
    exceptions do not pickle as they are)."""
    from eft.service import hub, isolation
    from eft.training.errors import TrainingUserError

    isolation.tenant.set(job.tenant)  # whose Hub reads these are (service/hub.py)
    hub.operator_token.set(hub_token)
    try:
        return "ok", validate_job(job, settings)
    except TrainingUserError as exc:
        return "user_error", (exc.code, exc.message, exc.param)
    except RequestInvalid as exc:
        return "invalid", exc.problems


def validate_job_isolated(job: JobRecord, settings: Settings) -> tuple[TrainConfig, dict[str, Any]]:
    """`validate_job` in the replica's helper process (service/isolation.py): tokenising a job's
    dataset is seconds of pure Python that, in the scheduler's thread, would hold the GIL the
    replica's event loop needs for every request. Raises as `validate_job` does."""
    from eft.service import isolation
    from eft.service.exports import hub_token
    from eft.training.errors import TrainingUserError

    kind, value = isolation.run(_validate_outcome, job, settings, hub_token(), pool="validate", param="training_file")
    if kind == "user_error":
        raise TrainingUserError(*value)
    if kind == "invalid":
        raise RequestInvalid(value)
    return value


def tokenize_options(req: JobCreate) -> Any:
    from eft.training.data import TokenizeOptions

    return TokenizeOptions(req.hyperparameters.max_seq_len, req.data.train_on, req.data.system_message,
                           tuple(sorted(req.data.columns.items())), req.objective)


def helper_imports() -> None:
    """What checking a job imports in a helper process (isolation.warm runs it in the helpers a
    replica starts; running it there imports this module too)."""
    import transformers  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    import eft.service.model_support  # noqa: F401
    import eft.training.datacache  # noqa: F401
