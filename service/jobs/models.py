"""The models a tenant may name: the base models under the allowed model roots, and what its
jobs trained (each succeeded job's `ft:` id, and each kept checkpoint's `...:ckpt-<step>`), as
`/v1/models` lists them and as a model server loads them (`Models.serving_target`)."""

from __future__ import annotations

from typing import Any

from eft.service.errors import Conflict, JobNotFound, ModelNotFound
from eft.service.jobs.openai import ORGANIZATION_PREFIX
from eft.service.jobs.wire import model_id
from eft.service.requests.paths import resolve_under_roots
from eft.service.serving.engine import AdapterSource, BaseSource
from eft.service.serving.model_ids import checkpoint_model_id, parse_model_id
from eft.service.serving.support import serving_engine
from eft.service.settings import Settings
from eft.service.store.store import JobRecord, Store
from eft.types.jobs import JobStatus
from eft.types.openai import Model, ModelList


class Models:
    """The model catalog of one service: read from the store and the allowed model roots."""

    def __init__(self, store: Store, settings: Settings):
        self.store, self.settings = store, settings

    def list(self, tenant: str | None) -> ModelList:
        """Base models first (by name), then `tenant`'s fine-tuned models, newest first."""
        return ModelList(data=[*self.base(), *(_fine_tuned(job) for job in self.fine_tuned(tenant))])

    def retrieve(self, model: str, tenant: str | None) -> Model:
        """One model: a base model's name, a fine-tuned model's `ft:` id, or one of its
        checkpoints' (while the checkpoint is kept). Raises ModelNotFound otherwise."""
        for base in self.base():
            if base.id == model:
                return base
        job, checkpoint = self.resolve(model, tenant)
        if checkpoint is None:
            return _fine_tuned(job)
        return Model(id=checkpoint["model"], created=int(checkpoint["created_at"].timestamp()),
                     owned_by=ORGANIZATION_PREFIX + job.tenant)

    def base(self) -> list[Model]:
        """The model directories under the allowed model roots (the first root naming one wins)."""
        found: dict[str, Model] = {}
        for root in self.settings.allowed_model_roots:
            for config in sorted(root.glob("*/config.json")) if root.is_dir() else ():
                if config.parent.name not in found:
                    found[config.parent.name] = Model(id=config.parent.name, created=int(config.stat().st_mtime),
                                                      owned_by="system", engine=_engine(config))
        return list(found.values())

    def fine_tuned(self, tenant: str | None) -> list[JobRecord]:
        """The succeeded jobs of `tenant` (None: every tenant's), newest first: the models they
        trained, as `/v1/models` lists them."""
        found: list[JobRecord] = []
        after = None
        while True:
            page, has_more = self.store.list_jobs(tenant=tenant, limit=100, after=after,
                                                  statuses=[JobStatus.succeeded])
            found += [j for j in page if j.artifact_path]
            if not has_more or not page:
                return found
            after = page[-1].id

    def serving_target(self, model: str, tenant: str | None) -> tuple[BaseSource, AdapterSource | None, str]:
        """What a model server loads to answer with `model`: the base model, the adapter (None
        for a base model itself), and how the job rendered a system message ("keep" or
        "fold"). A base model is one under the allowed model roots; a fine-tuned one must be
        this tenant's (ModelNotFound otherwise). Raises Conflict for a full fine-tuning job's
        model, which is a whole model rather than an adapter."""
        path = resolve_under_roots(model, self.settings.allowed_model_roots)
        if path is not None and (path / "config.json").is_file() and not model.startswith("ft:"):
            return BaseSource(str(path)), None, "keep"
        job, checkpoint = self.resolve(model, tenant)
        config = job.config or {}
        if config.get("method", (job.request.get("method") or {}).get("type")) == "full":
            raise Conflict(f"{model} was trained by full fine-tuning: it is a whole model, not an adapter "
                           "on its base; download it (GET /jobs/{id}/artifacts) and serve it as a base model",
                           code="model_not_servable", param="model")
        base = BaseSource(config.get("model_path") or job.request["model"], config.get("hub"))
        if checkpoint is None:
            return base, AdapterSource(model, job.artifact_path or "", "artifact"), config.get("system_message", "keep")
        return base, AdapterSource(model, checkpoint["path"], "checkpoint"), config.get("system_message", "keep")

    def resolve(self, model: str, tenant: str | None) -> tuple[JobRecord, dict[str, Any] | None]:
        """The job behind a fine-tuned model id, and the checkpoint it names (None: the model
        the job published). Raises ModelNotFound for an id that is not exactly one of this
        tenant's: another tenant's model, a job that has not succeeded (for the published
        model), a checkpoint never saved or pruned since, an id with another base or name."""
        ref = parse_model_id(model)
        if ref is None:
            raise ModelNotFound(model)
        try:
            job = self.store.get_job(ref.job_id, tenant)
        except JobNotFound:
            raise ModelNotFound(model) from None
        if ref.step is None:
            if model != model_id(job) or job.status is not JobStatus.succeeded or not job.artifact_path:
                raise ModelNotFound(model)
            return job, None
        for checkpoint in checkpoints_of(self.store, job):
            if checkpoint["model"] == model and checkpoint["available"]:
                return job, checkpoint
        raise ModelNotFound(model)


def _engine(config_file: Any) -> str | None:
    """The engine a base model is served with (service/serving/support.py), None for a config
    that does not read as JSON."""
    import json

    try:
        return serving_engine(json.loads(config_file.read_text()), cpu=not _gpu_model_servers())
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _gpu_model_servers() -> bool:
    import os

    return float(os.environ.get("EFT_INFERENCE_GPUS", "0") or 0) > 0


def _fine_tuned(job: JobRecord) -> Model:
    return Model(id=model_id(job), created=int((job.finished_at or job.created_at).timestamp()),
                 owned_by=ORGANIZATION_PREFIX + job.tenant)


def checkpoints_of(store: Store, job: JobRecord) -> list[dict[str, Any]]:
    """The job's checkpoints with their model ids, validation losses, and the kept one with
    the lowest validation loss marked `best`."""
    model = model_id(job)
    found = [{**c, "model": checkpoint_model_id(model, c["step"]),
              "eval_loss": (c.get("metrics") or {}).get("eval_loss")} for c in store.list_checkpoints(job.id)]
    # The best step as the job judged it (with its min_delta) when it saved its newest
    # evaluated checkpoint; else the kept checkpoint with the lowest loss.
    judged = [c["metrics"]["best_step"] for c in sorted(found, key=lambda c: c["step"])
              if isinstance((c.get("metrics") or {}).get("best_step"), (int, float))]
    kept = [c for c in found if c["available"] and isinstance(c["eval_loss"], (int, float))]
    best = next((c for c in kept if judged and c["step"] == int(judged[-1])), None)
    if best is None:  # that one was pruned, or evaluations fell between checkpoints
        best = min(kept, key=lambda c: (c["eval_loss"], c["step"]), default=None)
    for c in found:
        c["best"] = c is best
    return found

