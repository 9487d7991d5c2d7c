"""FastAPI dependencies as `Annotated` aliases: the job service and the calling tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.jobs import JobService


def get_job_service(request: Request) -> JobService:
    return request.app.state.job_service


def get_tenant() -> str:
    # Every caller is the default tenant until API keys resolve one.
    return "default"


JobServiceDep = Annotated[JobService, Depends(get_job_service)]
CurrentTenant = Annotated[str, Depends(get_tenant)]
