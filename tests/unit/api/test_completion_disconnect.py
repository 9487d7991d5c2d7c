"""A non-streamed completion whose client has gone stops generating: the collection is cancelled,
the model server's stream closed and the tenant's slot given back."""

import asyncio
from types import SimpleNamespace

import pytest

from eft.api.routes import completions
from eft.service.accounts.ratelimit import TenantSlots


class _Client:
    def __init__(self, gone_after: int):
        self.asked, self.gone_after = 0, gone_after

    async def is_disconnected(self) -> bool:
        self.asked += 1
        return self.asked > self.gone_after


def _request(client: _Client, slots: TenantSlots):
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(generations=slots)))
    request.is_disconnected = client.is_disconnected
    return request


class _Tokens:
    """A model server's stream: a token every `every_s`, for ever unless closed."""

    def __init__(self, every_s: float, count: int | None = None):
        self.every_s, self.count, self.sent, self.closed = every_s, count, 0, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.count is not None and self.sent > self.count + 1:
            raise StopAsyncIteration
        if self.count is not None and self.sent == self.count:
            self.sent += 1
            return {"index": 0, "finish_reason": "length"}
        if self.count is not None and self.sent == self.count + 1:
            self.sent += 1
            return {"usage": {"prompt_tokens": 1, "completion_tokens": self.count, "total_tokens": self.count + 1}}
        await asyncio.sleep(self.every_s)
        self.sent += 1
        return {"index": 0, "text": "x"}

    async def aclose(self):
        self.closed = True


def test_a_client_gone_cancels_the_generation_and_frees_the_slot(monkeypatch):
    monkeypatch.setattr(completions, "DISCONNECT_POLL_S", 0.01)
    slots, client, tokens = TenantSlots(1), _Client(gone_after=3), _Tokens(0.005)
    request = _request(client, slots)
    slot = completions._Slot(request, "acme")
    assert slots.open == {"acme": 1}
    with pytest.raises(completions.ClientGone):
        asyncio.run(completions._collect_while_connected(request, tokens, slot, 1))
    assert tokens.closed and slots.open == {}
    sent = tokens.sent
    assert 0 < sent < 100  # stopped soon after the client went, not at the end of the generation


def test_a_client_that_stays_gets_the_whole_answer():
    slots, tokens = TenantSlots(1), _Tokens(0.0, count=5)
    request = _request(_Client(gone_after=10**9), slots)
    slot = completions._Slot(request, "acme")
    (choice,), usage = asyncio.run(completions._collect_while_connected(request, tokens, slot, 1))
    assert ("".join(choice.text), choice.finish_reason, usage.completion_tokens) == ("xxxxx", "length", 5)
    assert tokens.closed and slots.open == {}
