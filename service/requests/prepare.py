"""Stage 4 of a job request: prepare it to run, in the scheduler (validating -> queued), in the
replica's helper process. The request is checked again against what is on disk now, its data is
tokenized with the model's tokenizer into the shared token cache, and its training config is
built: the one conversion from a request to a `TrainConfig`. Data that cannot train fails the job
with a user error the job carries."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eft.service.requests import hub
from eft.service.errors import RequestInvalid
from eft.service.requests.model_support import inspect_model
from eft.service.requests.check import ResolvedInputs, check_request
from eft.service.requests.plan import Choice
from eft.service.requests.templates import scheduler_tokenizer, tokenizer_signature
from eft.service.settings import Settings
from eft.training.config import TrainConfig, steps_for
from eft.types.jobs import JobCreate, LoraMethod

if TYPE_CHECKING:
    from eft.service.store.store import JobRecord


def token_cache_dir(settings: Settings) -> Path:
    """Where tokenised datasets are cached (validation fills it, the workers read it)."""
    return settings.home / "cache" / "tokens"


def tokenize_options(req: JobCreate) -> Any:
    from eft.training.data import TokenizeOptions

    return TokenizeOptions(req.hyperparameters.max_seq_len, req.data.train_on, req.data.system_message,
                           tuple(sorted(req.data.columns.items())), req.objective)


def build_train_config(
    job_id: str, req: JobCreate, inputs: ResolvedInputs, num_train_examples: int, settings: Settings,
    init: dict[str, Any] | None = None,
) -> TrainConfig:
    """The one conversion from a request to a training config, with server defaults filled.
    `init`: the checkpoint a continued job starts from (service/jobs/manager.py:resolve_continuation)."""
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
    tokenizer = scheduler_tokenizer(str(inputs.model_path), tokenizer_signature(inputs.model_path))
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
    from eft.service import isolation
    from eft.service.requests import hub
    from eft.training.errors import TrainingUserError

    isolation.tenant.set(job.tenant)  # whose Hub reads these are (service/requests/hub.py)
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
    from eft.service.credentials import hub_token
    from eft.training.errors import TrainingUserError

    kind, value = isolation.run(_validate_outcome, job, settings, hub_token(), pool="validate", param="training_file")
    if kind == "user_error":
        raise TrainingUserError(*value)
    if kind == "invalid":
        raise RequestInvalid(value)
    return value


def helper_imports() -> None:
    """What checking a job imports in a helper process (isolation.warm runs it in the helpers a
    replica starts; running it there imports this module too, and the stages whose functions
    the helpers run)."""
    import transformers  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    import eft.service.requests.model_support  # noqa: F401
    import eft.service.requests.templates  # noqa: F401
    import eft.training.datacache  # noqa: F401
