"""OpenAI's grader endpoints, `/v1/fine_tuning/alpha/graders/validate` and `/run`, as the official
`openai` package calls them (`client.fine_tuning.alpha.graders`): the graders of reinforcement jobs
(service/requests/graders.py). A model grader's judge is a model of this service, asked as the
caller's tenant through the same path as `/v1/chat/completions`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.types.openai import GraderRunRequest, GraderRunResponse, GraderValidateRequest, GraderValidateResponse

router = APIRouter(prefix="/v1/fine_tuning/alpha/graders", tags=["openai"])


@router.post("/validate", response_model=GraderValidateResponse)
def validate_grader(body: GraderValidateRequest, service: JobServiceDep, tenant: CurrentTenant) -> Any:
    """The grader, normalized (a name given where it had none), or a 422 naming each field at fault."""
    return service.validate_grader(body.grader)


@router.post("/run", response_model=GraderRunResponse)
async def run_grader(body: GraderRunRequest, request: Request, service: JobServiceDep, tenant: CurrentTenant) -> Any:
    """The reward of `model_sample` for `item`, with each grader's score and errors."""
    from eft.api.routes.completions import judge_reply

    asked = await run_in_threadpool(service.grader_judge_requests, body.grader, body.model_sample, body.item)
    replies = {}
    for call in asked:
        key, reply = await judge_reply(request, service, tenant, call)
        replies[key] = reply
    return await run_in_threadpool(service.run_grader, body.grader, body.model_sample, body.item, replies)
