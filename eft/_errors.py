"""Errors the client raises, one class per HTTP status, all built in `status_error`.

    try:
        client.jobs.create(model="tiny-llama", training_file="data/train.jsonl")
    except eft.UnprocessableEntityError as err:
        for problem in err.errors:
            print(problem["param"], problem["message"])

Every class derives from `EftError`, so `except eft.EftError` catches anything the client raises.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from eft.types.jobs import ErrorResponse, Job


class EftError(Exception):
    """Base of every error the eft client raises."""


class APIConnectionError(EftError):
    """The service could not be reached (refused, reset, DNS): no HTTP response came back."""


class APITimeoutError(APIConnectionError):
    """The service did not answer within the client's timeout."""


class WaitTimeoutError(EftError, TimeoutError):
    """`jobs.wait` gave up before the job reached a terminal status; `.job` is the last poll."""

    def __init__(self, job: Job, timeout_s: float):
        self.job = job
        self.timeout_s = timeout_s
        super().__init__(
            f"job {job.id} is still {job.status.value} after {timeout_s:g}s: wait again, "
            f"or cancel it with `eft jobs cancel {job.id}`"
        )


class DownloadError(EftError):
    """A downloaded file does not match the size or SHA-256 the service listed for it (or would
    land outside the destination); nothing of it is left in place."""


class APIStatusError(EftError):
    """The service answered with an error status.

    Attributes come from the error body `{"error": {"type", "code", "message", "param", "errors"}}`:
    `.errors` lists every problem as dicts with `param`, `code` and `message` (empty when the server
    reported a single problem), and `str()` shows all of them.
    """

    def __init__(self, status_code: int, body: Any, request_id: str | None = None,
                 retry_after_s: float | None = None):
        self.status_code = status_code
        self.body = body
        self.request_id = request_id
        #: Seconds the service asked to wait before trying again (its Retry-After), if it did.
        self.retry_after_s = retry_after_s
        try:
            detail = ErrorResponse.model_validate(body).error
        except ValidationError:
            detail = None
        text = body if isinstance(body, str) and body else f"HTTP {status_code}"
        self.type: str | None = detail.type if detail else None
        self.code: str | None = detail.code if detail else None
        self.message: str = detail.message if detail else text
        self.param: str | None = detail.param if detail else None
        self.errors: list[dict[str, Any]] = list(detail.errors or []) if detail else []
        super().__init__(self._describe())

    def _describe(self) -> str:
        head = f"{self.status_code} {self.code}: {self.message}" if self.code else (
            f"{self.status_code}: {self.message}"
        )
        if self.param and not self.errors:
            head += f" (param: {self.param})"
        lines = [head]
        for problem in self.errors:
            where = problem.get("param") or "request"
            code = f" [{problem['code']}]" if problem.get("code") else ""
            lines.append(f"  - {where}: {problem.get('message', '')}{code}")
        if self.retry_after_s is not None:
            lines.append(f"retry after: {self.retry_after_s:g}s")
        if self.request_id:
            lines.append(f"request id: {self.request_id}")
        return "\n".join(lines)


class BadRequestError(APIStatusError):
    """400: the request is malformed."""


class AuthenticationError(APIStatusError):
    """401: missing or wrong API key; set EFT_API_KEY or pass api_key=."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: no such job (or route)."""


class ConflictError(APIStatusError):
    """409: the job's state forbids this, or an Idempotency-Key was reused with another body.
    (A 409 for the same key still in flight is retried by the client first.)"""


class PayloadTooLargeError(APIStatusError):
    """413: the request body is too large."""


class UnprocessableEntityError(APIStatusError):
    """422: the request failed validation; `.errors` lists every problem."""


class RateLimitError(APIStatusError):
    """429: over a limit. `.retry_after_s` says how long to wait. A tenant quota
    (`code == "quota_exceeded"`) is raised at once, since it frees only when a job ends; other
    429s were retried first, honouring a Retry-After of up to a minute."""


class InternalServerError(APIStatusError):
    """5xx: the service failed; the client already retried."""


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error(status_code: int, body: Any, request_id: str | None = None,
                 retry_after_s: float | None = None) -> APIStatusError:
    """Return the `APIStatusError` subclass instance for `status_code` (never raises it)."""
    if status_code >= 500:
        cls: type[APIStatusError] = InternalServerError
    else:
        cls = _STATUS_ERRORS.get(status_code, APIStatusError)
    return cls(status_code, body, request_id, retry_after_s)
