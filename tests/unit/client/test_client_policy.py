"""The client's retry policy for 409 and 429, list pages, downloads, and log following with
resume, against an in-process fake server (httpx.MockTransport); no network, no sleeps.

Run: .venv/bin/python -m pytest tests/unit/client/test_client_policy.py -q
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from eft import ConflictError, JobStatus, RateLimitError
from tests.unit.client.test_client import FakeServer, error_json, job_json, make_async_client, make_client


def test_a_quota_429_is_raised_at_once_with_the_time_to_wait():
    quota = error_json(429, "quota_exceeded", "tenant 't' has 2 active jobs, the limit is 2")
    quota.headers["retry-after"] = "600"
    server = FakeServer(quota)
    sleeps: list[float] = []
    with pytest.raises(RateLimitError) as raised:
        make_client(server, sleeps).jobs.create(model="m", training_file="t.jsonl")
    assert len(server.requests) == 1 and sleeps == []
    assert raised.value.retry_after_s == 600 and raised.value.code == "quota_exceeded"
    assert "retry after: 600s" in str(raised.value)


def test_a_retry_after_longer_than_a_minute_is_left_to_the_caller():
    limited = error_json(429, "rate_limited", "slow down")
    limited.headers["retry-after"] = "3600"
    server = FakeServer(limited, httpx.Response(200, json=job_json()))
    sleeps: list[float] = []
    with pytest.raises(RateLimitError) as raised:
        make_client(server, sleeps).jobs.retrieve("ftjob-1")
    assert (len(server.requests), sleeps, raised.value.retry_after_s) == (1, [], 3600)


def test_a_409_is_retried_only_while_the_same_request_is_in_flight():
    in_flight = error_json(409, "idempotency_in_progress", "still being processed")
    server = FakeServer(in_flight, httpx.Response(201, json=job_json()))
    sleeps: list[float] = []
    assert make_client(server, sleeps).jobs.create(model="m", training_file="t.jsonl").id == "ftjob-1"
    assert len(server.requests) == 2 and len(sleeps) == 1
    for code in ("idempotency_key_reused", "job_finished"):
        server = FakeServer(error_json(409, code, "no"), httpx.Response(200, json=job_json()))
        with pytest.raises(ConflictError):
            make_client(server).jobs.cancel("ftjob-1")
        assert len(server.requests) == 1, code


def test_list_pages_iterate_their_items_and_statuses_print_as_values():
    events = {"object": "list", "has_more": False,
              "data": [{"id": 1, "job_id": "ftjob-1", "created_at": "2025-01-01T00:00:00Z", "attempt": 0,
                        "type": "created", "level": "info", "message": "job created", "data": {}}]}
    files = {"object": "list", "has_more": False, "data": [
        {"id": "file-1", "bytes": 3, "created_at": 1, "filename": "t.jsonl", "purpose": "fine-tune",
         "sha256": "ab"}]}
    server = FakeServer(lambda r: httpx.Response(200, json=events if "/events" in r.url.path else files))
    client = make_client(server)
    page = client.jobs.list_events("ftjob-1")
    assert [e.type for e in page] == ["created"] and len(page) == 1 and page[0].id == 1
    assert [f.id for f in client.files.list()] == ["file-1"]
    assert f"{JobStatus.succeeded}" == str(JobStatus.succeeded) == "succeeded"


def test_file_content_downloads_the_bytes():
    server = FakeServer(httpx.Response(200, content=b'{"a": 1}\n'))
    assert make_client(server).files.content("file-1") == b'{"a": 1}\n'
    assert server.requests[0].url.path == "/files/file-1/content"


class DroppingLogStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A log stream that sends some events, then breaks the connection."""

    def __init__(self, chunks: list[bytes], then_drop: bool):
        self.chunks, self.then_drop = chunks, then_drop

    def __iter__(self):
        yield from self.chunks
        if self.then_drop:
            raise httpx.ReadError("connection reset")

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk
        if self.then_drop:
            raise httpx.ReadError("connection reset")


def _log_server() -> FakeServer:
    """First connection: an attempt event, two lines, then a drop. The reconnect must say where
    it was (Last-Event-ID 1:2) and gets the third line and the end."""
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        if request.headers.get("last-event-id") is None:
            chunks = [b'event: attempt\ndata: {"attempt": 1}\n\n', b"id: 1:1\ndata: step 1\n\n",
                      b": ping\n\nid: 1:2\ndata: step 2\n\n"]
            return httpx.Response(200, stream=DroppingLogStream(chunks, then_drop=True))
        assert request.headers["last-event-id"] == "1:2"
        chunks = [b"id: 1:3\ndata: step 3\n\n", b'event: end\ndata: {"status": "succeeded"}\n\n']
        return httpx.Response(200, stream=DroppingLogStream(chunks, then_drop=False))
    return FakeServer(answer)


def test_following_logs_resumes_after_a_dropped_connection():
    server = _log_server()
    assert list(make_client(server).jobs.follow_logs("ftjob-1")) == ["step 1", "step 2", "step 3"]
    assert len(server.requests) == 2


def test_the_async_client_follows_logs_the_same_way():
    server, sleeps = _log_server(), []

    async def follow() -> list[str]:
        async with make_async_client(server, sleeps) as client:
            return [line async for line in client.jobs.follow_logs("ftjob-1")]

    assert asyncio.run(follow()) == ["step 1", "step 2", "step 3"] and len(sleeps) == 1


def test_the_async_client_has_the_sync_clients_whole_surface():
    import inspect

    from eft import AsyncClient, Client
    from eft.files import AsyncFiles, Files
    from eft.jobs import AsyncJobs, Jobs

    def public(cls: type) -> set[str]:
        return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}

    for sync, async_ in ((Client, AsyncClient), (Jobs, AsyncJobs), (Files, AsyncFiles)):
        assert public(sync) == public(async_), sync.__name__
        for name in public(sync) - {"close"}:
            method = getattr(async_, name)
            assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
            assert list(inspect.signature(method).parameters) == list(
                inspect.signature(getattr(sync, name)).parameters), name
