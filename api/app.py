"""The FastAPI application: routers, the error envelope and request ids.

`create_app(job_service)` builds it; `service/deployment.py` serves it on Ray Serve. Every error
leaves as `{"error": {"type", "code", "message", "param"}}` (422s add `errors`, one entry per
problem) with the `x-request-id` header that every response carries.
"""

from __future__ import annotations

import logging
import uuid
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.deps import JobServiceDep
from api.models import Health
from api.routes import jobs, plan
from service.errors import Problem, RequestInvalid, ServiceError
from service.jobs import JobService
from service.validation import check_raw_inputs

log = logging.getLogger("eft.api")
REQUEST_ID = "x-request-id"


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
        return _error(exc.status_code, exc.type, exc.code, exc.message, exc.param, request, errors)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [_problem_from_pydantic(e) for e in exc.errors()]
        # Also check the files and model the body names, so one 422 lists every problem.
        if request.url.path.rstrip("/") == "/jobs" and isinstance(exc.body, dict):
            service: JobService = request.app.state.job_service
            problems += check_raw_inputs(exc.body, service.settings)
        err = RequestInvalid(problems=problems)
        return _error(422, err.type, err.code, err.message, err.param, request,
                      [p.as_dict() for p in problems])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, "invalid_request_error", code, str(exc.detail), None, request)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, "server_error", "internal_error",
                      "the server failed on this request; retry, and report the request id if it persists",
                      None, request)


def create_app(job_service: JobService) -> FastAPI:
    """The service's FastAPI application, serving `job_service`."""
    app = FastAPI(
        title="eft: elastic fine-tuning on Ray",
        version=_version(),
        description="Fine-tune Hugging Face models with LoRA, QLoRA or full training on Ray Train.",
    )
    app.state.job_service = job_service

    @app.middleware("http")
    async def request_id(request: Request, call_next):  # noqa: ANN001, ANN202
        rid = request.headers.get(REQUEST_ID) or f"req_{uuid.uuid4().hex[:16]}"
        request.state.request_id = rid
        response = await call_next(request)
        response.headers[REQUEST_ID] = rid
        return response

    _install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(plan.router)

    @app.get("/healthz", response_model=Health, tags=["health"])
    def healthz(service: JobServiceDep) -> Health:
        database = service.store.ping()
        return Health(status="ok" if database else "degraded", version=_version(), database=database)

    return app
