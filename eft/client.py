"""Python client of the eft fine-tuning service, with identical sync and async surfaces.

    from eft import Client

    client = Client()  # EFT_BASE_URL and EFT_API_KEY, else ~/.eft/config.json (`eft up` writes it)
    job = client.jobs.create(model="tiny-llama", training_file="data/train.jsonl",
                             hyperparameters={"max_steps": 20})
    job = client.jobs.wait(job.id, on_progress=lambda job, metric: print(job.step, metric))
    for job in client.jobs.list(status="running"):  # walks every page
        print(job.id)

`AsyncClient` has the same methods as coroutines (`await client.jobs.create(...)`,
`async for job in await client.jobs.list()`). Connection errors, timeouts and 408/409/429/5xx
answers are retried `max_retries` times with jittered exponential backoff, honouring Retry-After;
each `jobs.create` call sends one Idempotency-Key across its retries so a retry never makes two jobs.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from email.utils import parsedate_to_datetime
from importlib import metadata
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from eft.types.files import DatasetReport, FileDeleted, FileList, FileObject, ValidateRequest
from eft.types.jobs import (
    Health,
    Job,
    JobCreate,
    JobEventList,
    JobList,
    JobLogs,
    JobMetric,
    JobMetricList,
    JobStatus,
)
from eft.types.plans import Plan, PlanRequest
from eft._config import read_config
from eft._errors import APIConnectionError, APITimeoutError, WaitTimeoutError, status_error

try:
    __version__ = metadata.version("eft")
except metadata.PackageNotFoundError:
    __version__ = "0.0.0"

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 60.0  # a longer Retry-After is more likely a misconfiguration than advice
RETRYABLE_STATUSES = frozenset({408, 409, 429})

ProgressCallback = Callable[[Job, JobMetric | None], Any]
M = TypeVar("M", bound=BaseModel)


def _retry_after_s(response: httpx.Response) -> float | None:
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
    return seconds if 0 <= seconds <= MAX_RETRY_AFTER_S else None


def _create_body(request: JobCreate | Mapping[str, Any] | None, fields: dict[str, Any]) -> dict:
    """Validate the request locally (raises pydantic.ValidationError) and keep only set fields."""
    if isinstance(request, JobCreate):
        base = request.model_dump(exclude_unset=True)
    else:
        base = dict(request or {})
    job = JobCreate.model_validate({**base, **fields})
    # Unset fields are left out so the server's defaults apply, not this client's.
    return job.model_dump(mode="json", exclude_unset=True)


def _plan_body(request: PlanRequest | Mapping[str, Any] | None, fields: dict[str, Any]) -> dict:
    """Validate a plan request locally (raises pydantic.ValidationError); keep only set fields."""
    if isinstance(request, PlanRequest):
        base = request.model_dump(exclude_unset=True)
    else:
        base = dict(request or {})
    return PlanRequest.model_validate({**base, **fields}).model_dump(mode="json", exclude_unset=True)


def _list_params(limit: int, after: str | None, status: JobStatus | str | None) -> dict:
    params: dict[str, Any] = {"limit": limit, "after": after}
    params["status"] = status.value if isinstance(status, JobStatus) else status
    return params


def sse_lines(lines: Iterable[str]) -> Iterator[str]:
    """The `data:` payloads of server-sent events, one per log line; other fields and
    comments (keep-alives, attempt and end markers) are skipped."""
    event = None
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line == "":
            event = None
        elif line.startswith("data:") and event is None:
            yield line[6:] if line.startswith("data: ") else line[5:]


class _BaseClient:
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

    def _retry_delay_s(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None and (after := _retry_after_s(response)) is not None:
            return after
        delay = min(INITIAL_RETRY_DELAY_S * 2**attempt, MAX_RETRY_DELAY_S)
        return delay * (1 - 0.25 * random.random())

    def _should_retry(self, attempt: int, response: httpx.Response) -> bool:
        code = response.status_code
        return attempt < self.max_retries and (code in RETRYABLE_STATUSES or code >= 500)

    def _transport_error(self, exc: httpx.TransportError, url: str) -> APIConnectionError:
        if isinstance(exc, httpx.TimeoutException):
            return APITimeoutError(
                f"request to {url} timed out after {self.timeout:g}s: check the service "
                "or pass a larger timeout="
            )
        return APIConnectionError(
            f"could not reach {url} ({exc}): start the service with `eft up` "
            "or point EFT_BASE_URL at it"
        )

    @staticmethod
    def _parse(response: httpx.Response, cast: type[M]) -> M:
        if response.is_success:
            return cast.model_validate(response.json())
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        raise status_error(response.status_code, body, response.headers.get("x-request-id"))


class Client(_BaseClient):
    """Synchronous client. `sleep` (default `time.sleep`) waits between retries and polls."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 30.0, max_retries: int = 3, http_client: httpx.Client | None = None,
                 *, sleep: Callable[[float], Any] | None = None):
        super().__init__(base_url, api_key, timeout, max_retries)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client()
        self._sleep = sleep or time.sleep
        self.jobs = Jobs(self)
        self.files = Files(self)

    def health(self) -> Health:
        """Return the service's health (GET /healthz); raises `EftError` subclasses."""
        return self._request("GET", "/healthz", cast=Health)

    def plan(self, request: PlanRequest | Mapping[str, Any] | None = None, **fields: Any) -> Plan:
        """Plan a job on a cluster (POST /plan): every candidate configuration with its predicted
        memory, and the fastest that fits, e.g.
        `client.plan(model="llama-2-70b", hyperparameters={"max_seq_len": 4096,
        "micro_batch_size": 1}, cluster={"gpus": 8, "gpu_memory_gb": 32})`.

        Raises pydantic.ValidationError before sending, `EftError` subclasses for the answer.
        """
        return self._request("POST", "/plan", cast=Plan, json=_plan_body(request, fields))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, cast: type[M], json: Any = None,
                 params: Mapping | None = None, idempotency_key: str | None = None, **extra: Any) -> M:
        kwargs = self._request_kwargs(method, path, json, params, idempotency_key, **extra)
        for attempt in range(self.max_retries + 1):
            try:
                response = self._http.request(**kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                self._sleep(self._retry_delay_s(attempt, None))
                continue
            if not self._should_retry(attempt, response):
                return self._parse(response, cast)
            self._sleep(self._retry_delay_s(attempt, response))
        raise AssertionError("unreachable: the last attempt always returns or raises")


class AsyncClient(_BaseClient):
    """Asynchronous client, same surface as `Client`; `sleep` defaults to `asyncio.sleep`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 30.0, max_retries: int = 3,
                 http_client: httpx.AsyncClient | None = None,
                 *, sleep: Callable[[float], Awaitable[Any]] | None = None):
        super().__init__(base_url, api_key, timeout, max_retries)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient()
        self._sleep = sleep or asyncio.sleep
        self.jobs = AsyncJobs(self)
        self.files = AsyncFiles(self)

    async def health(self) -> Health:
        """Return the service's health (GET /healthz); raises `EftError` subclasses."""
        return await self._request("GET", "/healthz", cast=Health)

    async def plan(self, request: PlanRequest | Mapping[str, Any] | None = None,
                   **fields: Any) -> Plan:
        """Plan a job on a cluster (POST /plan); returns the `Plan`. Raises as `Client.plan`."""
        return await self._request("POST", "/plan", cast=Plan, json=_plan_body(request, fields))

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(self, method: str, path: str, *, cast: type[M], json: Any = None,
                       params: Mapping | None = None, idempotency_key: str | None = None, **extra: Any) -> M:
        kwargs = self._request_kwargs(method, path, json, params, idempotency_key, **extra)
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._http.request(**kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                await self._sleep(self._retry_delay_s(attempt, None))
                continue
            if not self._should_retry(attempt, response):
                return self._parse(response, cast)
            await self._sleep(self._retry_delay_s(attempt, response))
        raise AssertionError("unreachable: the last attempt always returns or raises")


class JobPage:
    """One page of `jobs.list`; `.data` is this page, iterating yields jobs of every later page."""

    def __init__(self, body: JobList, fetch: Callable[[str], JobPage]):
        self.body = body
        self.data, self.has_more, self.next_cursor = body.data, body.has_more, body.next_cursor
        self._fetch = fetch

    def next_page(self) -> JobPage | None:
        """Return the following page, or None on the last one."""
        return self._fetch(self.next_cursor) if self.has_more and self.next_cursor else None

    def __iter__(self) -> Iterator[Job]:
        page: JobPage | None = self
        while page is not None:
            yield from page.data
            page = page.next_page()


class AsyncJobPage:
    """Async twin of `JobPage`: `async for job in page` walks every later page."""

    def __init__(self, body: JobList, fetch: Callable[[str], Awaitable[AsyncJobPage]]):
        self.body = body
        self.data, self.has_more, self.next_cursor = body.data, body.has_more, body.next_cursor
        self._fetch = fetch

    async def next_page(self) -> AsyncJobPage | None:
        """Return the following page, or None on the last one."""
        return await self._fetch(self.next_cursor) if self.has_more and self.next_cursor else None

    async def __aiter__(self) -> AsyncIterator[Job]:
        page: AsyncJobPage | None = self
        while page is not None:
            for job in page.data:
                yield job
            page = await page.next_page()


class Jobs:
    """`client.jobs`: create, inspect, cancel and wait for fine-tuning jobs."""

    def __init__(self, client: Client):
        self._client = client

    def create(self, request: JobCreate | Mapping[str, Any] | None = None, **fields: Any) -> Job:
        """Submit a job (POST /jobs); `fields` override `request`. Returns the new `Job`.

        Raises pydantic.ValidationError before sending when the request is invalid, and
        `EftError` subclasses for what the service answers.
        """
        body = _create_body(request, fields)
        return self._client._request("POST", "/jobs", cast=Job, json=body,
                                     idempotency_key=str(uuid.uuid4()))

    def retrieve(self, job_id: str) -> Job:
        """Return the job (GET /jobs/{id}); raises `NotFoundError` when there is none."""
        return self._client._request("GET", f"/jobs/{job_id}", cast=Job)

    def list(self, limit: int = 20, after: str | None = None,
             status: JobStatus | str | None = None) -> JobPage:
        """Return the first page of jobs, newest first; iterate it to walk every page."""
        body = self._client._request("GET", "/jobs", cast=JobList,
                                     params=_list_params(limit, after, status))
        return JobPage(body, lambda cursor: self.list(limit=limit, after=cursor, status=status))

    def cancel(self, job_id: str) -> Job:
        """Ask the job to stop (POST /jobs/{id}/cancel); returns it, usually `cancelling`."""
        return self._client._request("POST", f"/jobs/{job_id}/cancel", cast=Job)

    def list_events(self, job_id: str, after: int | None = None, limit: int = 100) -> JobEventList:
        """Return the job's events with id greater than `after`, oldest first."""
        return self._client._request("GET", f"/jobs/{job_id}/events", cast=JobEventList,
                                     params={"after": after, "limit": limit})

    def metrics(self, job_id: str) -> JobMetricList:
        """Return the job's reported training metrics, oldest step first."""
        return self._client._request("GET", f"/jobs/{job_id}/metrics", cast=JobMetricList)

    def logs(self, job_id: str, attempt: int | None = None, tail: int | None = None) -> JobLogs:
        """Return the driver logs of the job's latest attempt (or `attempt`), from Ray Jobs."""
        return self._client._request("GET", f"/jobs/{job_id}/logs", cast=JobLogs,
                                     params={"attempt": attempt, "tail": tail})

    def follow_logs(self, job_id: str, attempt: int | None = None) -> Iterator[str]:
        """Yield the job's log lines as they are written, until the job ends (server-sent
        events from GET /jobs/{id}/logs?follow=true). Raises `EftError` subclasses."""
        kwargs = self._client._request_kwargs("GET", f"/jobs/{job_id}/logs", None,
                                              {"follow": "true", "attempt": attempt}, None)
        kwargs["headers"]["Accept"] = "text/event-stream"
        kwargs["timeout"] = httpx.Timeout(self._client.timeout, read=None)
        try:
            with self._client._http.stream(**kwargs) as response:
                if not response.is_success:
                    response.read()
                    self._client._parse(response, JobLogs)
                yield from sse_lines(response.iter_lines())
        except httpx.TransportError as exc:
            raise self._client._transport_error(exc, kwargs["url"]) from exc

    def wait(self, job_id: str, poll_interval_s: float = 1.0, timeout_s: float | None = None,
             on_progress: ProgressCallback | None = None) -> Job:
        """Poll until the job is succeeded, failed or cancelled and return it.

        `on_progress(job, latest_metric_or_None)` is called after every poll. Raises
        `WaitTimeoutError` (carrying the last job) after `timeout_s`, and `EftError` subclasses.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.retrieve(job_id)
            if on_progress is not None:
                points = self.metrics(job_id).data
                on_progress(job, points[-1] if points else None)
            if job.status.is_terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(job, timeout_s)
            self._client._sleep(poll_interval_s)


class AsyncJobs:
    """`async_client.jobs`: the coroutine twin of `Jobs`; see it for each method's contract."""

    def __init__(self, client: AsyncClient):
        self._client = client

    async def create(self, request: JobCreate | Mapping[str, Any] | None = None,
                     **fields: Any) -> Job:
        """Submit a job (POST /jobs); returns the new `Job`. Raises as `Jobs.create`."""
        body = _create_body(request, fields)
        return await self._client._request("POST", "/jobs", cast=Job, json=body,
                                           idempotency_key=str(uuid.uuid4()))

    async def retrieve(self, job_id: str) -> Job:
        """Return the job; raises `NotFoundError` when there is none."""
        return await self._client._request("GET", f"/jobs/{job_id}", cast=Job)

    async def list(self, limit: int = 20, after: str | None = None,
                   status: JobStatus | str | None = None) -> AsyncJobPage:
        """Return the first page of jobs; `async for` over it walks every page."""
        body = await self._client._request("GET", "/jobs", cast=JobList,
                                           params=_list_params(limit, after, status))
        return AsyncJobPage(body, lambda cursor: self.list(limit=limit, after=cursor, status=status))

    async def cancel(self, job_id: str) -> Job:
        """Ask the job to stop; returns it."""
        return await self._client._request("POST", f"/jobs/{job_id}/cancel", cast=Job)

    async def list_events(self, job_id: str, after: int | None = None,
                          limit: int = 100) -> JobEventList:
        """Return the job's events with id greater than `after`, oldest first."""
        return await self._client._request("GET", f"/jobs/{job_id}/events", cast=JobEventList,
                                           params={"after": after, "limit": limit})

    async def metrics(self, job_id: str) -> JobMetricList:
        """Return the job's reported training metrics, oldest step first."""
        return await self._client._request("GET", f"/jobs/{job_id}/metrics", cast=JobMetricList)

    async def logs(self, job_id: str, attempt: int | None = None, tail: int | None = None) -> JobLogs:
        """Return the driver logs of the job's latest attempt (or `attempt`)."""
        return await self._client._request("GET", f"/jobs/{job_id}/logs", cast=JobLogs,
                                           params={"attempt": attempt, "tail": tail})

    async def wait(self, job_id: str, poll_interval_s: float = 1.0, timeout_s: float | None = None,
                   on_progress: ProgressCallback | None = None) -> Job:
        """Poll until the job is terminal and return it; `on_progress` may be sync or async.

        Raises `WaitTimeoutError` (carrying the last job) after `timeout_s`.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = await self.retrieve(job_id)
            if on_progress is not None:
                points = (await self.metrics(job_id)).data
                result = on_progress(job, points[-1] if points else None)
                if inspect.isawaitable(result):
                    await result
            if job.status.is_terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(job, timeout_s)
            await self._client._sleep(poll_interval_s)


def _upload_fields(file: str | os.PathLike | bytes, filename: str | None, purpose: str) -> dict:
    """Multipart fields of an upload; the bytes are read once so retries resend the same file."""
    if isinstance(file, bytes):
        content, name = file, filename or "data.jsonl"
    else:
        with open(file, "rb") as fh:
            content = fh.read()
        name = filename or os.path.basename(os.fspath(file))
    return {"files": {"file": (name, content, "application/octet-stream")}, "data": {"purpose": purpose}}


class Files:
    """`client.files`: upload, list, retrieve, validate and delete training files."""

    def __init__(self, client: Client):
        self._client = client

    def create(self, file: str | os.PathLike | bytes, filename: str | None = None,
               purpose: str = "fine-tune") -> FileObject:
        """Upload a JSONL file (POST /files, one Idempotency-Key across retries); returns it."""
        return self._client._request("POST", "/files", cast=FileObject, idempotency_key=str(uuid.uuid4()),
                                     **_upload_fields(file, filename, purpose))

    def list(self, limit: int = 20, after: str | None = None) -> FileList:
        """Return one page of files, newest first; pass `next_cursor` as `after` for the next."""
        return self._client._request("GET", "/files", cast=FileList, params={"limit": limit, "after": after})

    def retrieve(self, file_id: str) -> FileObject:
        return self._client._request("GET", f"/files/{file_id}", cast=FileObject)

    def validate(self, file_id: str, **options: Any) -> DatasetReport:
        """Check every line without creating a job; `model`, `max_seq_len`, `validation_file`."""
        return self._client._request("POST", f"/files/{file_id}/validate", cast=DatasetReport,
                                     json=ValidateRequest.model_validate(options).model_dump(exclude_unset=True))

    def delete(self, file_id: str) -> FileDeleted:
        return self._client._request("DELETE", f"/files/{file_id}", cast=FileDeleted)


class AsyncFiles:
    """`async_client.files`: the coroutine twin of `Files`."""

    def __init__(self, client: AsyncClient):
        self._client = client

    async def create(self, file: str | os.PathLike | bytes, filename: str | None = None,
                     purpose: str = "fine-tune") -> FileObject:
        return await self._client._request("POST", "/files", cast=FileObject,
                                           idempotency_key=str(uuid.uuid4()),
                                           **_upload_fields(file, filename, purpose))

    async def list(self, limit: int = 20, after: str | None = None) -> FileList:
        return await self._client._request("GET", "/files", cast=FileList,
                                           params={"limit": limit, "after": after})

    async def retrieve(self, file_id: str) -> FileObject:
        return await self._client._request("GET", f"/files/{file_id}", cast=FileObject)

    async def validate(self, file_id: str, **options: Any) -> DatasetReport:
        return await self._client._request(
            "POST", f"/files/{file_id}/validate", cast=DatasetReport,
            json=ValidateRequest.model_validate(options).model_dump(exclude_unset=True))

    async def delete(self, file_id: str) -> FileDeleted:
        return await self._client._request("DELETE", f"/files/{file_id}", cast=FileDeleted)
