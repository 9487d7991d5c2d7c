"""Domain errors of the service. One handler in api/app.py maps them to HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Problem:
    """One thing wrong with a request: which field, a stable code, and what to do."""

    param: str
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"param": self.param, "code": self.code, "message": self.message}


class ServiceError(Exception):
    status_code = 400
    type = "invalid_request_error"
    code = "bad_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code:
            self.code = code


class JobNotFound(ServiceError):
    status_code = 404
    code = "job_not_found"

    def __init__(self, job_id: str):
        super().__init__(
            f"no job with id {job_id!r}: list jobs with GET /jobs", param="job_id"
        )


class ModelNotFound(ServiceError):
    status_code = 404
    code = "model_not_found"

    def __init__(self, model: str):
        super().__init__(f"no model {model!r} for this key: list the models you can use with GET /v1/models",
                         param="model")


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


@dataclass
class RequestInvalid(ServiceError):
    """Every problem found in one request, reported together as one 422."""

    problems: list[Problem] = field(default_factory=list)

    status_code = 422
    code = "validation_failed"

    def __post_init__(self) -> None:
        first = self.problems[0] if self.problems else None
        summary = f"{len(self.problems)} problem(s) in the request"
        if first:
            summary += f"; first: {first.param}: {first.message}"
        ServiceError.__init__(self, summary, param=first.param if first else None)
