"""Python client of the eft fine-tuning service, with identical sync and async surfaces.

    from eft import Client

    client = Client()  # EFT_BASE_URL and EFT_API_KEY, else ~/.eft/config.json (`eft up` writes it)
    job = client.jobs.create(model="tiny-llama", training_file="data/train.jsonl",
                             hyperparameters={"max_steps": 20})
    job = client.jobs.wait(job.id, on_progress=lambda job, metric: print(job.step, metric))
    for job in client.jobs.list(status="running"):  # walks every page
        print(job.id)
    for line in client.jobs.follow_logs(job.id):
        print(line)

`AsyncClient` has the same methods as coroutines (`await client.jobs.create(...)`,
`async for job in await client.jobs.list()`, `async for line in client.jobs.follow_logs(id)`).
Connection errors, timeouts, 408, 429 and 5xx answers are retried `max_retries` times with
jittered exponential backoff, honouring a Retry-After of up to a minute; a tenant quota's 429
and every 409 but "the same request is still in flight" are raised at once. Each `jobs.create`
call sends one Idempotency-Key across its retries, so a retry never makes two jobs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import httpx

from eft._base import BaseClient, EventParser, M, ServerEvent, __version__, plan_body, server_events
from eft.files import AsyncFiles, Files
from eft.jobs import AsyncJobPage, AsyncJobs, JobPage, Jobs
from eft.models import AsyncModels, Models
from eft.webhooks import Webhooks
from eft.types.jobs import Health
from eft.types.plans import Plan, PlanRequest

__all__ = ["AsyncClient", "AsyncJobPage", "Client", "JobPage", "__version__"]


class Client(BaseClient):
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
        self.models = Models(self)
        self.webhooks = Webhooks(self)

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
        return self._request("POST", "/plan", cast=Plan, json=plan_body(request, fields))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, *, json: Any = None, params: Mapping | None = None,
              idempotency_key: str | None = None, **extra: Any) -> httpx.Response:
        """The response to the request after retries; raises the error of a failed one."""
        kwargs = self._request_kwargs(method, path, json, params, idempotency_key, **extra)
        for attempt in range(self.max_retries + 1):
            try:
                response = self._http.request(**kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                self._sleep(self._backoff_s(attempt))
                continue
            wait_s = self._retry_wait_s(attempt, response)
            if wait_s is None:
                if not response.is_success:
                    raise self._error(response)
                return response
            self._sleep(wait_s)
        raise AssertionError("unreachable: the last attempt always returns or raises")

    def _request(self, method: str, path: str, *, cast: type[M], **kwargs: Any) -> M:
        return cast.model_validate(self._send(method, path, **kwargs).json())

    def _request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def _request_bytes(self, method: str, path: str, **kwargs: Any) -> bytes:
        return self._send(method, path, **kwargs).content

    def _events(self, path: str, params: Mapping[str, Any]) -> Iterator[ServerEvent]:
        """The server-sent events of a GET as they come. A dropped connection is resumed from
        the last event id received (`Last-Event-ID`), up to `max_retries` times."""
        last_id: str | None = None
        for retry in range(self.max_retries + 1):
            kwargs = self._follow_kwargs(path, params, last_id)
            try:
                with self._http.stream(**kwargs) as response:
                    if not response.is_success:
                        response.read()
                        raise self._error(response)
                    for event in server_events(response.iter_lines()):
                        last_id = event.id or last_id
                        yield event
                return  # the server closed the stream: nothing more to read
            except httpx.TransportError as exc:
                if retry >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                self._sleep(self._backoff_s(retry))

    def _download(self, path: str, params: Mapping[str, Any], open_sink: Callable[[], Any]) -> Any:
        """A streamed GET of one file into `open_sink()`'s sink; a dropped connection starts it
        over on a new sink, up to `max_retries` times. Returns the sink's `finish()`."""
        kwargs = self._download_kwargs(path, params)
        for retry in range(self.max_retries + 1):
            sink = open_sink()
            try:
                with self._http.stream(**kwargs) as response:
                    if not response.is_success:
                        response.read()
                        raise self._error(response)
                    for chunk in response.iter_bytes():
                        sink.write(chunk)
                return sink.finish()
            except httpx.TransportError as exc:
                sink.abort()
                if retry >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                self._sleep(self._backoff_s(retry))
            except BaseException:
                sink.abort()
                raise
        raise AssertionError("unreachable: the last try always returns or raises")


class AsyncClient(BaseClient):
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
        self.models = AsyncModels(self)

    async def health(self) -> Health:
        """Return the service's health (GET /healthz); raises `EftError` subclasses."""
        return await self._request("GET", "/healthz", cast=Health)

    async def plan(self, request: PlanRequest | Mapping[str, Any] | None = None, **fields: Any) -> Plan:
        """Plan a job on a cluster (POST /plan); returns the `Plan`. Raises as `Client.plan`."""
        return await self._request("POST", "/plan", cast=Plan, json=plan_body(request, fields))

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, method: str, path: str, *, json: Any = None, params: Mapping | None = None,
                    idempotency_key: str | None = None, **extra: Any) -> httpx.Response:
        kwargs = self._request_kwargs(method, path, json, params, idempotency_key, **extra)
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._http.request(**kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                await self._sleep(self._backoff_s(attempt))
                continue
            wait_s = self._retry_wait_s(attempt, response)
            if wait_s is None:
                if not response.is_success:
                    raise self._error(response)
                return response
            await self._sleep(wait_s)
        raise AssertionError("unreachable: the last attempt always returns or raises")

    async def _request(self, method: str, path: str, *, cast: type[M], **kwargs: Any) -> M:
        return cast.model_validate((await self._send(method, path, **kwargs)).json())

    async def _request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._send(method, path, **kwargs)).json()

    async def _request_bytes(self, method: str, path: str, **kwargs: Any) -> bytes:
        return (await self._send(method, path, **kwargs)).content

    async def _events(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[ServerEvent]:
        """`Client._events`, as the events come in on this event loop."""
        last_id: str | None = None
        for retry in range(self.max_retries + 1):
            kwargs = self._follow_kwargs(path, params, last_id)
            try:
                async with self._http.stream(**kwargs) as response:
                    if not response.is_success:
                        await response.aread()
                        raise self._error(response)
                    parser = EventParser()
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            last_id = event.id or last_id
                            yield event
                return
            except httpx.TransportError as exc:
                if retry >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                await self._sleep(self._backoff_s(retry))

    async def _download(self, path: str, params: Mapping[str, Any], open_sink: Callable[[], Any]) -> Any:
        """`Client._download`, streamed on this event loop."""
        kwargs = self._download_kwargs(path, params)
        for retry in range(self.max_retries + 1):
            sink = open_sink()
            try:
                async with self._http.stream(**kwargs) as response:
                    if not response.is_success:
                        await response.aread()
                        raise self._error(response)
                    async for chunk in response.aiter_bytes():
                        sink.write(chunk)
                return sink.finish()
            except httpx.TransportError as exc:
                sink.abort()
                if retry >= self.max_retries:
                    raise self._transport_error(exc, kwargs["url"]) from exc
                await self._sleep(self._backoff_s(retry))
            except BaseException:
                sink.abort()
                raise
        raise AssertionError("unreachable: the last try always returns or raises")
