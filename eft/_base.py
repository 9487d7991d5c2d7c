"""What `Client` and `AsyncClient` share: configuration, the retry policy, request bodies and
the server-sent events reader."""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from importlib import metadata
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from eft._config import read_config
from eft._errors import APIConnectionError, APITimeoutError, status_error
from eft.types.jobs import JobCreate, JobStatus
from eft.types.plans import PlanRequest

try:
    __version__ = metadata.version("eft")
except metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0"

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
#: The longest Retry-After the client waits out by itself; a longer one is raised to the
#: caller (`RateLimitError.retry_after_s`), whose program may have better things to do.
MAX_RETRY_AFTER_S = 60.0
#: 409 codes that mean "the same request is still being processed": the one conflict a retry
#: can resolve. Any other 409 (a job's state, a reused Idempotency-Key) is raised at once.
RETRYABLE_CONFLICTS = frozenset({"idempotency_in_progress"})
#: 429 codes a retry cannot resolve soon: a tenant quota frees only when a job ends.
FINAL_RATE_LIMITS = frozenset({"quota_exceeded"})

M = TypeVar("M", bound=BaseModel)


def retry_after_s(response: httpx.Response) -> float | None:
    """Seconds the server asked us to wait (Retry-After as seconds or HTTP date), if any."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds)


def error_code(response: httpx.Response) -> str | None:
    """The `error.code` of an error response, if it has one."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def create_body(request: JobCreate | Mapping[str, Any] | None, fields: dict[str, Any]) -> dict:
    """Validate a job request locally (raises pydantic.ValidationError); keep only set fields."""
    base = request.model_dump(exclude_unset=True) if isinstance(request, JobCreate) else dict(request or {})
    # Unset fields are left out so the server's defaults apply, not this client's.
    return JobCreate.model_validate({**base, **fields}).model_dump(mode="json", exclude_unset=True)


def plan_body(request: PlanRequest | Mapping[str, Any] | None, fields: dict[str, Any]) -> dict:
    """Validate a plan request locally (raises pydantic.ValidationError); keep only set fields."""
    base = request.model_dump(exclude_unset=True) if isinstance(request, PlanRequest) else dict(request or {})
    return PlanRequest.model_validate({**base, **fields}).model_dump(mode="json", exclude_unset=True)


def list_params(limit: int, after: str | None, status: JobStatus | str | None) -> dict:
    return {"limit": limit, "after": after, "status": status.value if isinstance(status, JobStatus) else status}


@dataclass
class ServerEvent:
    """One server-sent event: `event` is None for a plain data event (a log line)."""

    data: str
    event: str | None = None
    id: str | None = None

    def json(self) -> Any:
        return json.loads(self.data)


class EventParser:
    """Reads a `text/event-stream` line by line; `feed` returns each event as it completes
    (comments, the keep-alives, are skipped)."""

    def __init__(self) -> None:
        self.data: list[str] = []
        self.event: str | None = None
        self.id: str | None = None

    def feed(self, line: str) -> ServerEvent | None:
        if line == "":
            done = ServerEvent("\n".join(self.data), self.event, self.id) if self.data else None
            self.data, self.event, self.id = [], None, None
            return done
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            self.data.append(value)
        elif field == "event":
            self.event = value
        elif field == "id":
            self.id = value
        return None


def server_events(lines: Iterable[str]) -> Iterator[ServerEvent]:
    """The server-sent events of a stream's lines, each as soon as it is complete."""
    parser = EventParser()
    # The trailing blank line ends an event whose stream was cut after its last field.
    for line in itertools.chain(lines, [""]):
        event = parser.feed(line)
        if event is not None:
            yield event


class BaseClient:
    """Configuration and the retry policy shared by `Client` and `AsyncClient`."""

    def __init__(self, base_url: str | None, api_key: str | None, timeout: float, max_retries: int):
        saved = read_config()
        self.base_url = (base_url or os.environ.get("EFT_BASE_URL") or saved.get("base_url")
                         or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else (os.environ.get("EFT_API_KEY")
                                                           or saved.get("api_key"))
        self.timeout = timeout
        self.max_retries = max_retries

    def _request_kwargs(self, method: str, path: str, json: Any, params: Mapping | None,
                        idempotency_key: str | None, **extra: Any) -> dict[str, Any]:
        headers = {"Accept": "application/json", "User-Agent": f"eft-python/{__version__}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return {"method": method, "url": self.base_url + path, "json": json, "params": query,
                "headers": headers, "timeout": self.timeout, **extra}

    @staticmethod
    def _backoff_s(attempt: int) -> float:
        delay = min(INITIAL_RETRY_DELAY_S * 2**attempt, MAX_RETRY_DELAY_S)
        return delay * (1 - 0.25 * random.random())

    def _retry_wait_s(self, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before sending the request again, or None to answer with this
        response now: 408 and 5xx retry; 429 retries unless it is a quota; 409 only while the
        same request is in flight; a Retry-After over MAX_RETRY_AFTER_S is left to the caller."""
        status = response.status_code
        if attempt >= self.max_retries:
            return None
        if status == 409 and error_code(response) not in RETRYABLE_CONFLICTS:
            return None
        if status == 429 and error_code(response) in FINAL_RATE_LIMITS:
            return None
        if status not in (408, 409, 429) and status < 500:
            return None
        after = retry_after_s(response)
        if after is None:
            return self._backoff_s(attempt)
        return after if after <= MAX_RETRY_AFTER_S else None

    def _transport_error(self, exc: httpx.TransportError, url: str) -> APIConnectionError:
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(f"request to {url} timed out after {self.timeout:g}s: check the "
                                   "service or pass a larger timeout=")
        return APIConnectionError(f"could not reach {url} ({exc}): start the service with `eft up` "
                                  "or point EFT_BASE_URL at it")

    @staticmethod
    def _error(response: httpx.Response) -> Exception:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        return status_error(response.status_code, body, response.headers.get("x-request-id"),
                            retry_after_s(response))

    def _download_kwargs(self, path: str, params: Mapping) -> dict[str, Any]:
        kwargs = self._request_kwargs("GET", path, None, params, None)
        kwargs["headers"]["Accept"] = "application/octet-stream"
        del kwargs["json"]
        return kwargs

    def _follow_kwargs(self, path: str, params: Mapping, last_event_id: str | None) -> dict[str, Any]:
        kwargs = self._request_kwargs("GET", path, None, params, None)
        kwargs["headers"]["Accept"] = "text/event-stream"
        if last_event_id:
            kwargs["headers"]["Last-Event-ID"] = last_event_id
        kwargs["timeout"] = httpx.Timeout(self.timeout, read=None)
        return kwargs
