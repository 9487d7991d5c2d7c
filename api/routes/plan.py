"""`/plan`: predicted memory of every training configuration, and the fastest one that fits."""

from __future__ import annotations

from fastapi import APIRouter

from eft.api.deps import JobServiceDep
from eft.types.plans import Plan, PlanRequest

router = APIRouter(tags=["plan"])


@router.post("/plan", response_model=Plan)
def create_plan(body: PlanRequest, service: JobServiceDep) -> Plan:
    """Plan a job on `cluster`: every candidate with its memory terms and reason, the chosen one,
    and when nothing fits the nearest changes that would. 422 for an unknown model."""
    return Plan.model_validate(service.plan(body))
