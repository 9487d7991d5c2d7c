"""`/v1/models`: the base models this server fine-tunes and the models its tenant's jobs trained,
in OpenAI's shapes. A fine-tuned model is listed by its `ft:` id (service/model_ids.py) once its
job succeeded; each of its checkpoints can be retrieved by its own id. A tenant sees only its
own models: another tenant's id is a 404, as an unknown one is."""

from __future__ import annotations

from fastapi import APIRouter

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.types.openai import Model, ModelList
from eft.service.wire import model_id
from eft.service.openai_compat import ORGANIZATION_PREFIX
from eft.service.settings import Settings
from eft.service.store import JobRecord

router = APIRouter(prefix="/v1/models", tags=["openai"])


def _base_models(settings: Settings) -> list[Model]:
    """The model directories under the allowed model roots (the first root naming one wins)."""
    found: dict[str, Model] = {}
    for root in settings.allowed_model_roots:
        for config in sorted(root.glob("*/config.json")) if root.is_dir() else ():
            found.setdefault(config.parent.name, Model(id=config.parent.name, created=int(config.stat().st_mtime),
                                                       owned_by="system"))
    return list(found.values())


def _fine_tuned(job: JobRecord) -> Model:
    return Model(id=model_id(job), created=int((job.finished_at or job.created_at).timestamp()),
                 owned_by=ORGANIZATION_PREFIX + job.tenant)


@router.get("", response_model=ModelList)
def list_models(service: JobServiceDep, tenant: CurrentTenant) -> ModelList:
    """Base models first (by name), then this tenant's fine-tuned models, newest first."""
    return ModelList(data=[*_base_models(service.settings),
                           *(_fine_tuned(job) for job in service.fine_tuned_models(tenant))])


@router.get("/{model:path}", response_model=Model)
def retrieve_model(model: str, service: JobServiceDep, tenant: CurrentTenant) -> Model:
    """One model: a base model's name, a fine-tuned model's `ft:` id, or one of its checkpoints'
    (`...:ckpt-<step>`, while the checkpoint is kept). 404 (`model_not_found`) otherwise."""
    for base in _base_models(service.settings):
        if base.id == model:
            return base
    job, checkpoint = service.resolve_model(model, tenant)
    if checkpoint is None:
        return _fine_tuned(job)
    return Model(id=checkpoint["model"], created=int(checkpoint["created_at"].timestamp()),
                 owned_by=ORGANIZATION_PREFIX + job.tenant)
