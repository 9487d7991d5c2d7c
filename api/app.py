"""The FastAPI application: routers, the error envelope and request ids.

`create_app(job_service)` builds it; `api/deployment.py` serves it on Ray Serve. Every error
leaves as `{"error": {"type", "code", "message", "param"}}` (422s add `errors`, one entry per
problem) with the `x-request-id` header that every response carries.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


from eft.api.deps import CurrentPrincipal, JobServiceDep, get_principal
from eft.api.middleware import REQUEST_ID, RequestContext
from eft.types.jobs import Caller, ErrorResponse, Health
from eft.api.routes import artifacts, completions, files, graders, jobs, openai, plan
from eft.api.routes import logs as logs_routes
from eft.api.routes import manifest as manifest_routes
from eft.api.routes import models as models_routes
from eft.api.routes import metrics as metrics_routes
from eft.api.routes import ui as ui_routes
from eft.api.routes import webhooks as webhooks_routes
from eft.service.errors import Problem, RequestInvalid, ServiceError
from eft.service.jobs.manager import JobService
from eft.service.runs.logs import LogStreams
from eft.service.accounts.ratelimit import TenantRateLimiter, TenantSlots, TenantTokenBudget

log = logging.getLogger("eft.api")


_ERROR_EXAMPLE = {"error": {"type": "invalid_request_error", "code": "job_not_found",
                            "message": "no job with id 'ftjob-x': list jobs with GET /jobs",
                            "param": "job_id"}}
#: Every error a route may answer, each with the one envelope (documented for every route).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description,
             "content": {"application/json": {"example": _ERROR_EXAMPLE}}}
    for status, description in [
        (400, "Bad request"), (401, "Missing, invalid or revoked API key"),
        (404, "No such object for this tenant"), (405, "Method not allowed"),
        (409, "Conflict (state, or an Idempotency-Key reused with another body)"),
        (413, "Body or upload too large"), (415, "Unsupported media type"),
        (422, "Invalid request: every problem listed in `errors`"),
        (429, "Over the tenant's quota; see Retry-After"),
        (503, "Not available yet (a model server starting); see Retry-After"),
    ]
}


def _version() -> str:
    try:
        return metadata.version("eft")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _error(status: int, type_: str, code: str, message: str, param: str | None,
           request: Request, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"type": type_, "code": code, "message": message, "param": param}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse({"error": body}, status_code=status,
                        headers={REQUEST_ID: getattr(request.state, "request_id", "")})


def _problem_from_pydantic(err: dict[str, Any]) -> Problem:
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    param = ".".join(loc) or "body"
    kind = err.get("type", "invalid")
    message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = f"unknown field {param!r}: remove it or check its spelling (fields: /openapi.json)"
    elif kind == "missing":
        message = f"{param} is required"
    elif kind == "json_invalid":
        message = f"the body is not valid JSON: {err.get('ctx', {}).get('error', message)}"
    return Problem(param=param, code=kind, message=message)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        errors = [p.as_dict() for p in exc.problems] if isinstance(exc, RequestInvalid) else None
        response = _error(exc.status_code, exc.type, exc.code, exc.message, exc.param, request, errors)
        response.headers.update(getattr(exc, "headers", None) or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [_problem_from_pydantic(e) for e in exc.errors()]
        # Also check the files and model the body names, so one 422 lists every problem: only
        # for an authenticated caller, only files it owns (another tenant's file id is just not
        # found, never read), and in a worker thread (a scan takes seconds on a large file).
        if (request.url.path.rstrip("/") == "/jobs" and isinstance(exc.body, dict)
                and hasattr(request.state, "scope")):
            service: JobService = request.app.state.job_service
            problems += await run_in_threadpool(service.raw_body_problems, exc.body, request.state.scope)
        err = RequestInvalid(problems=problems)
        return _error(422, err.type, err.code, err.message, err.param, request,
                      [p.as_dict() for p in problems])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
                415: "unsupported_media_type"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, "invalid_request_error", code, str(exc.detail), None, request)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "server_error", "internal_error",
                      "the server failed on this request; retry, and report the request id if it persists",
                      None, request)


def create_app(job_service: JobService, models: Any = None) -> FastAPI:
    """The service's FastAPI application, serving `job_service`; completions go to `models`
    (api/inference.py:ServeModels, or service/serving/engines.py:LocalModels in one process; None:
    they answer 503)."""
    settings = job_service.settings
    app = FastAPI(
        title="eft: elastic fine-tuning on Ray",
        version=_version(),
        description="Fine-tune Hugging Face models with LoRA, QLoRA or full training on Ray Train.",
    )
    app.state.job_service = job_service
    app.state.models = models
    app.state.keys = job_service.keys
    app.state.files = job_service.files
    app.state.rate_limiter = TenantRateLimiter(settings.requests_per_s_per_tenant, settings.request_burst_per_tenant)
    app.state.log_streams = LogStreams(settings.log_streams_per_tenant, settings.log_stream_max_s)
    app.state.generations = TenantSlots(settings.generations_per_tenant)
    app.state.generation_tokens = TenantTokenBudget(settings.generation_tokens_per_minute)
    app.state.default_max_tokens = settings.inference_default_max_tokens

    app.add_middleware(RequestContext, settings=settings)
    _install_error_handlers(app)
    metrics_routes.install(app)
    json_limit = settings.max_request_bytes
    app.include_router(jobs.router, responses=ERROR_RESPONSES, max_body_size=json_limit)
    app.include_router(plan.router, dependencies=[Depends(get_principal)], responses=ERROR_RESPONSES,
                       max_body_size=json_limit)
    # Uploads may be larger than JSON bodies; FileStore enforces the exact upload limit.
    upload_limit = settings.max_upload_bytes + 1024**2
    app.include_router(files.router, max_body_size=upload_limit, responses=ERROR_RESPONSES)
    app.include_router(files.router, prefix="/v1", max_body_size=upload_limit, include_in_schema=False)
    app.include_router(openai.router, responses=ERROR_RESPONSES, max_body_size=json_limit)
    app.include_router(graders.router, responses=ERROR_RESPONSES, max_body_size=json_limit)
    app.include_router(models_routes.router, responses=ERROR_RESPONSES)
    app.include_router(completions.router, responses=ERROR_RESPONSES, max_body_size=json_limit)
    app.include_router(logs_routes.router, responses=ERROR_RESPONSES)
    app.include_router(manifest_routes.router, responses=ERROR_RESPONSES)
    app.include_router(artifacts.router, responses=ERROR_RESPONSES)
    app.include_router(webhooks_routes.router, responses=ERROR_RESPONSES, max_body_size=json_limit)
    ui_routes.install(app)

    @app.get("/me", response_model=Caller, tags=["auth"], responses=ERROR_RESPONSES)
    def me(principal: CurrentPrincipal) -> Caller:
        """The caller's tenant and role; Ray's dashboard address for admins only."""
        return Caller(tenant=principal.tenant, role=principal.role,
                      ray_dashboard_url=settings.ray_dashboard_url if principal.is_admin else None)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz(service: JobServiceDep) -> Health:
        # Not on the request thread pool (`EFT_API_THREADS`): probes answer while slow
        # requests (uploads, first model loads) hold every one of its threads.
        database = await asyncio.to_thread(service.ping)
        return Health(status="ok" if database else "degraded", version=_version(), database=database)

    return app
