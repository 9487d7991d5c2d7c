"""The API's side of the model servers: a request no replica takes within the start timeout is
a 503 with Retry-After (the replica is starting), and the call is cancelled; one that a replica
takes streams what it sends. The handle stands in for Serve's (its transport is tested end to
end in tests/e2e/test_openai_job.py)."""

from __future__ import annotations

import asyncio

import pytest

from eft.api.inference import ModelsUnavailable, ServeModels
from eft.service.serving.engine import BaseSource, Request


class _Responses:
    def __init__(self, items, delay_s):
        self.items, self.delay_s, self.cancelled = list(items), delay_s, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(self.delay_s)
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self):
        self.cancelled = True


class _Handle:
    def __init__(self, responses):
        self.responses, self.options_seen = responses, None

    def options(self, **options):
        self.options_seen = options
        return self

    @property
    def generate(self):
        return self

    def remote(self, base, adapter, request):
        self.args = (base, adapter, request)
        return self.responses


def test_no_replica_within_the_timeout_is_a_503_with_retry_after():
    responses = _Responses([{"accepted": True}], delay_s=5)
    models = ServeModels(_Handle(responses), start_timeout_s=0.05, retry_after_s=7)

    async def first():
        return await models.stream(BaseSource("/models/a"), None, Request(prompt="x")).__anext__()

    with pytest.raises(ModelsUnavailable) as err:
        asyncio.run(first())
    assert err.value.status_code == 503 and err.value.headers == {"Retry-After": "7"}
    assert err.value.code == "model_server_starting" and "0.05 s" in err.value.message
    assert responses.cancelled


def test_a_taken_request_streams_what_the_replica_sends_after_its_acceptance():
    responses = _Responses([{"accepted": True}, {"text": "hi"}, {"finish_reason": "stop", "usage": {}}], delay_s=0)
    handle = _Handle(responses)
    models = ServeModels(handle, start_timeout_s=1, retry_after_s=7)

    async def collect():
        return [item async for item in models.stream(BaseSource("/models/a"), None, Request(prompt="x"))]

    assert asyncio.run(collect()) == [{"text": "hi"}, {"finish_reason": "stop", "usage": {}}]
    assert handle.options_seen == {"multiplexed_model_id": "/models/a", "stream": True}
    assert handle.args[0] == {"path": "/models/a", "hub": None} and handle.args[1] is None
