"""`/v1/models`: the base models this server fine-tunes and the models its tenant's jobs trained,
in OpenAI's shapes. A fine-tuned model is listed by its `ft:` id (service/serving/model_ids.py; the catalog: service/jobs/models.py) once its
job succeeded; each of its checkpoints can be retrieved by its own id. A tenant sees only its
own models: another tenant's id is a 404, as an unknown one is."""

from __future__ import annotations

from fastapi import APIRouter

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.types.openai import Model, ModelList

router = APIRouter(prefix="/v1/models", tags=["openai"])


@router.get("", response_model=ModelList)
def list_models(service: JobServiceDep, tenant: CurrentTenant) -> ModelList:
    """Base models first (by name), then this tenant's fine-tuned models, newest first."""
    return service.models.list(tenant)


@router.get("/{model:path}", response_model=Model)
def retrieve_model(model: str, service: JobServiceDep, tenant: CurrentTenant) -> Model:
    """One model: a base model's name, a fine-tuned model's `ft:` id, or one of its checkpoints'
    (`...:ckpt-<step>`, while the checkpoint is kept). 404 (`model_not_found`) otherwise."""
    return service.models.retrieve(model, tenant)
