"""The eft client against an in-process fake server (httpx.MockTransport); no network, no sleeps.

Run: .venv/bin/python -m pytest tests/unit/client/test_client.py -q
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import httpx
import pytest
from pydantic import ValidationError

import eft
from eft import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncClient,
    Client,
    InternalServerError,
    JobCreate,
    JobStatus,
    NotFoundError,
    RateLimitError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from eft._errors import status_error

BASE_URL = "http://eft.test"
Handler = Callable[[httpx.Request], httpx.Response]


def job_json(job_id: str = "ftjob-1", status: str = "queued", step: int = 0, **extra) -> dict:
    return {
        "id": job_id, "status": status, "model": "tiny-llama",
        "training_file": "data/train.jsonl", "method": {"type": "lora"}, "hyperparameters": {},
        "scaling": {}, "strategy": "auto", "checkpoint": {},
        "created_at": "2025-01-01T00:00:00Z", "step": step, "total_steps": 10, **extra,
    }


def error_json(status: int, code: str, message: str, errors: list | None = None) -> httpx.Response:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message,
                      "param": None, "errors": errors}}
    return httpx.Response(status, json=body, headers={"x-request-id": "req_abc"})


class FakeServer:
    """Answers requests with a queue of responses (or a function) and records what it got."""

    def __init__(self, *responses: httpx.Response | Handler | Exception):
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer


def make_client(server: FakeServer, sleeps: list[float] | None = None, **kwargs) -> Client:
    record = sleeps.append if sleeps is not None else (lambda s: None)
    http = httpx.Client(transport=httpx.MockTransport(server))
    return Client(base_url=BASE_URL, http_client=http, sleep=record, **kwargs)


def make_async_client(server: FakeServer, sleeps: list[float], **kwargs) -> AsyncClient:
    async def record(seconds: float) -> None:
        sleeps.append(seconds)

    http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return AsyncClient(base_url=BASE_URL, http_client=http, sleep=record, **kwargs)


# --- create, retries, idempotency ----------------------------------------------------------


def test_create_sends_only_set_fields_and_one_idempotency_key_across_retries():
    server = FakeServer(httpx.Response(503), httpx.Response(201, json=job_json()))
    sleeps: list[float] = []
    client = make_client(server, sleeps, api_key="sk-test")

    job = client.jobs.create(model="tiny-llama", training_file="data/train.jsonl",
                             hyperparameters={"max_steps": 5})

    assert job.id == "ftjob-1" and job.status is JobStatus.queued
    assert len(server.requests) == 2 and len(sleeps) == 1
    first, retry = server.requests
    assert first.method == "POST" and first.url == f"{BASE_URL}/jobs"
    assert json.loads(first.content) == {"model": "tiny-llama", "training_file": "data/train.jsonl",
                                         "hyperparameters": {"max_steps": 5}}
    key = first.headers["idempotency-key"]
    assert uuid.UUID(key) and retry.headers["idempotency-key"] == key
    assert first.headers["authorization"] == "Bearer sk-test"


def test_each_create_call_gets_its_own_idempotency_key():
    server = FakeServer(httpx.Response(201, json=job_json()))
    client = make_client(server)
    request = JobCreate(model="tiny-llama", training_file="data/train.jsonl")
    client.jobs.create(request)
    client.jobs.create(request, name="second")
    keys = {r.headers["idempotency-key"] for r in server.requests}
    assert len(keys) == 2
    assert json.loads(server.requests[1].content)["name"] == "second"


def test_create_rejects_an_invalid_request_before_sending():
    server = FakeServer(httpx.Response(201, json=job_json()))
    with pytest.raises(ValidationError):
        make_client(server).jobs.create(model="tiny-llama")  # no training_file
    assert server.requests == []


def test_retry_after_is_honoured_on_429():
    limited = httpx.Response(429, headers={"retry-after": "0.01"})
    server = FakeServer(limited, httpx.Response(200, json=job_json()))
    sleeps: list[float] = []
    job = make_client(server, sleeps).jobs.retrieve("ftjob-1")
    assert job.id == "ftjob-1" and sleeps == [0.01]


def test_gives_up_after_max_retries_with_the_status_error():
    server = FakeServer(error_json(429, "rate_limited", "slow down"))
    sleeps: list[float] = []
    with pytest.raises(RateLimitError):
        make_client(server, sleeps, max_retries=2).jobs.retrieve("ftjob-1")
    assert len(server.requests) == 3 and len(sleeps) == 2
    assert all(0 < s <= 8.0 for s in sleeps)  # jittered exponential backoff, capped


def test_5xx_is_retried_then_raised_as_internal_server_error():
    server = FakeServer(httpx.Response(502, text="bad gateway"))
    with pytest.raises(InternalServerError) as info:
        make_client(server, max_retries=1).health()
    assert len(server.requests) == 2 and info.value.message == "bad gateway"


def test_connection_errors_and_timeouts_are_retried_then_raised():
    refused = FakeServer(httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError, match="eft up"):
        make_client(refused, max_retries=2).jobs.retrieve("ftjob-1")
    assert len(refused.requests) == 3

    slow = FakeServer(httpx.ReadTimeout("slow"), httpx.Response(200, json=job_json()))
    assert make_client(slow).jobs.retrieve("ftjob-1").id == "ftjob-1"
    with pytest.raises(APITimeoutError):
        make_client(FakeServer(httpx.ReadTimeout("slow")), max_retries=0).jobs.retrieve("x")


# --- errors ----------------------------------------------------------------------------------


def test_422_exposes_every_problem():
    problems = [
        {"param": "hyperparameters.learning_rate", "code": "greater_than", "message": "must be > 0"},
        {"param": "scaling.min_workers", "code": "too_large", "message": "exceeds max_workers"},
    ]
    server = FakeServer(error_json(422, "invalid_request", "2 problems in the request", problems))
    with pytest.raises(UnprocessableEntityError) as info:
        make_client(server).jobs.create(model="m", training_file="t.jsonl")
    err = info.value
    assert len(server.requests) == 1  # a 422 is not retried
    assert err.status_code == 422 and err.code == "invalid_request"
    assert err.errors == problems and err.request_id == "req_abc"
    text = str(err)
    for problem in problems:
        assert problem["param"] in text and problem["message"] in text


def test_404_is_not_found_error():
    server = FakeServer(error_json(404, "job_not_found", "no job ftjob-x: list jobs with ..."))
    with pytest.raises(NotFoundError) as info:
        make_client(server).jobs.retrieve("ftjob-x")
    assert info.value.code == "job_not_found" and info.value.request_id == "req_abc"
    assert len(server.requests) == 1


@pytest.mark.parametrize("code, cls", [
    (400, eft.BadRequestError), (401, eft.AuthenticationError), (403, eft.PermissionDeniedError),
    (404, eft.NotFoundError), (409, eft.ConflictError), (413, eft.PayloadTooLargeError),
    (422, eft.UnprocessableEntityError), (429, eft.RateLimitError), (500, InternalServerError),
    (503, InternalServerError), (418, APIStatusError),
])
def test_status_error_maps_each_code_to_one_class(code, cls):
    err = status_error(code, {"error": {"type": "t", "code": "c", "message": "m"}}, "req_1")
    assert type(err) is cls and isinstance(err, eft.EftError) and err.message == "m"


# --- list, wait, endpoints -------------------------------------------------------------------


def test_list_iterates_across_pages():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("after") == "c1":
            return httpx.Response(200, json={"data": [job_json("ftjob-3")], "has_more": False})
        page = [job_json("ftjob-1"), job_json("ftjob-2")]
        return httpx.Response(200, json={"data": page, "has_more": True, "next_cursor": "c1"})

    server = FakeServer(answer)
    page = make_client(server).jobs.list(limit=2, status=JobStatus.running)
    assert [j.id for j in page.data] == ["ftjob-1", "ftjob-2"] and page.has_more
    assert [j.id for j in page] == ["ftjob-1", "ftjob-2", "ftjob-3"]
    assert [dict(r.url.params) for r in server.requests] == [
        {"limit": "2", "status": "running"}, {"limit": "2", "status": "running", "after": "c1"}]


def test_events_and_metrics_endpoints():
    event = {"id": 7, "job_id": "ftjob-1", "created_at": "2025-01-01T00:00:00Z",
             "type": "status", "message": "queued"}
    server = FakeServer(httpx.Response(200, json={"data": [event], "has_more": False}),
                        httpx.Response(200, json={"data": []}))
    client = make_client(server)
    assert client.jobs.list_events("ftjob-1", after=6, limit=5).data[0].id == 7
    assert client.jobs.metrics("ftjob-1").data == []
    assert str(server.requests[0].url) == f"{BASE_URL}/jobs/ftjob-1/events?after=6&limit=5"
    assert server.requests[1].url.path == "/jobs/ftjob-1/metrics"


def progressing_server(final: str = "succeeded") -> FakeServer:
    """Job polls go queued -> running -> `final`; metrics report one step."""
    statuses = iter(["queued", "running", final])
    metric = {"step": 5, "created_at": "2025-01-01T00:00:00Z",
              "values": {"loss": 1.5, "tokens_per_s": 1000.0}}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/metrics"):
            return httpx.Response(200, json={"data": [metric]})
        return httpx.Response(200, json=job_json(status=next(statuses), step=5))

    return FakeServer(answer)


def test_wait_returns_on_terminal_status_and_reports_progress():
    sleeps: list[float] = []
    seen = []
    job = make_client(progressing_server(), sleeps).jobs.wait(
        "ftjob-1", poll_interval_s=0.5, on_progress=lambda j, m: seen.append((j.status, m)))
    assert job.status is JobStatus.succeeded
    assert [s for s, _ in seen] == [JobStatus.queued, JobStatus.running, JobStatus.succeeded]
    assert seen[-1][1].values["loss"] == 1.5
    assert sleeps == [0.5, 0.5]


def test_wait_timeout_carries_the_last_job():
    server = FakeServer(httpx.Response(200, json=job_json(status="running")))
    with pytest.raises(WaitTimeoutError) as info:
        make_client(server).jobs.wait("ftjob-1", timeout_s=0)
    assert info.value.job.status is JobStatus.running and "ftjob-1" in str(info.value)


def test_base_url_and_api_key_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("EFT_BASE_URL", "http://from-env:9000/")
    monkeypatch.setenv("EFT_API_KEY", "sk-env")
    client = Client()
    assert client.base_url == "http://from-env:9000" and client.api_key == "sk-env"
    monkeypatch.delenv("EFT_BASE_URL")
    assert Client().base_url == "http://127.0.0.1:8000"


# --- async mirrors sync ----------------------------------------------------------------------


def test_async_client_mirrors_create_retrieve_list_and_wait():
    async def scenario() -> None:
        sleeps: list[float] = []
        server = FakeServer(httpx.Response(503), httpx.Response(201, json=job_json()))
        async with make_async_client(server, sleeps) as client:
            job = await client.jobs.create(model="tiny-llama", training_file="data/train.jsonl")
            assert job.id == "ftjob-1" and len(server.requests) == 2
            keys = {r.headers["idempotency-key"] for r in server.requests}
            assert len(keys) == 1
            assert (await client.jobs.retrieve("ftjob-1")).id == "ftjob-1"

        seen = []

        async def on_progress(job, metric) -> None:
            seen.append(job.status)

        async with make_async_client(progressing_server("failed"), sleeps) as client:
            job = await client.jobs.wait("ftjob-1", poll_interval_s=0.1, on_progress=on_progress)
        assert job.status is JobStatus.failed and seen[-1] is JobStatus.failed

        pages = FakeServer(
            httpx.Response(200, json={"data": [job_json("a")], "has_more": True,
                                      "next_cursor": "c"}),
            httpx.Response(200, json={"data": [job_json("b")], "has_more": False}))
        async with make_async_client(pages, sleeps) as client:
            assert [j.id async for j in await client.jobs.list(limit=1)] == ["a", "b"]

    asyncio.run(scenario())


def test_async_errors_match_sync():
    async def scenario() -> None:
        server = FakeServer(error_json(404, "job_not_found", "no such job"))
        async with make_async_client(server, []) as client:
            with pytest.raises(NotFoundError):
                await client.jobs.retrieve("ftjob-x")

    asyncio.run(scenario())
