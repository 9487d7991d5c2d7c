"""`/v1/chat/completions` and `/v1/completions`: OpenAI's request and response shapes, answered by
the model servers (api/inference.py) from a base model or a fine-tuned model of the caller's
tenant, `stream: true` as server-sent events ending with `data: [DONE]`.

The model id is resolved here (a base model under the allowed model roots, or an `ft:` id of
one of the tenant's jobs or of a kept checkpoint: 404 otherwise); the model server renders the
prompt with the base model's chat template as training did. A refusal (a prompt longer than the
context, messages the template cannot render) arrives before the first token, so it is an
HTTP error in the envelope even for a streamed request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from eft.api.deps import CurrentTenant, JobServiceDep
from eft.service.errors import ServiceError
from eft.service.accounts.ratelimit import TenantSlots
from eft.service.serving.engine import Request as Generation
from eft.types.openai import (
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionCreate, ChoiceLogprobs,
    ChunkChoice, ChunkDelta, Completion, CompletionChoice, CompletionCreate, CompletionLogprobs, TokenLogprob,
    TopLogprob, Usage,
)

router = APIRouter(prefix="/v1", tags=["openai"])
log = logging.getLogger("eft.api.completions")


#: How often a non-streamed completion checks that its client is still there.
DISCONNECT_POLL_S = 0.5


class ClientGone(ServiceError):
    """The client closed the connection before its completion was ready (nobody reads this)."""

    status_code = 499
    code = "client_closed_request"


class InferenceUnavailable(ServiceError):
    status_code = 503
    type = "server_error"
    code = "inference_unavailable"


class GenerationRefused(ServiceError):
    def __init__(self, error: dict[str, Any]):
        super().__init__(error["message"], param=error.get("param"), code=error["code"])
        self.status_code = int(error["status"])
        if self.status_code >= 500:
            self.type = "server_error"
        if self.status_code == 429:
            self.type = "rate_limit_error"
        if error.get("retry_after_s"):
            self.headers = {"Retry-After": str(int(error["retry_after_s"]))}


def _models(request: Request) -> Any:
    models = getattr(request.app.state, "models", None)
    if models is None:
        raise InferenceUnavailable("this server runs no model servers: deploy the service with them "
                                   "(eft up, or the Serve config under deploy/)", param="model")
    return models


class _Slot:
    """One of the tenant's generation slots (app.state.generations) and the completion tokens
    charged to its budget (app.state.generation_tokens): the slot given back once whichever way the
    generation ends (answered, refused, failed, or its client gone), the tokens it did not
    generate refunded when its usage arrives."""

    def __init__(self, request: Request, tenant: str | None, generation: Generation | None = None):
        self.slots: TenantSlots = request.app.state.generations
        self.tenant = tenant or ""
        self.slots.take(self.tenant, f"tenant {self.tenant!r} already has {self.slots.per_tenant} completions in "
                        "flight on this server: wait for one to finish, then retry")
        self.held, self.budget, self.charged = True, getattr(request.app.state, "generation_tokens", None), 0
        if self.budget is not None and generation is not None:
            most = generation.max_tokens or request.app.state.default_max_tokens
            try:
                self.charged = self.budget.charge(self.tenant, most * generation.n)
            except BaseException:
                self.release()
                raise

    def settle(self, completion_tokens: int) -> None:
        if self.charged:
            self.budget.refund(self.tenant, self.charged - completion_tokens)
            self.charged = 0

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.give_back(self.tenant)


async def _open(request: Request, service: Any, tenant: str | None, model: str,
                generation: Generation) -> tuple[AsyncIterator[dict[str, Any]], _Slot]:
    """The model server's items for this request, its first one already read, and the tenant's
    slot it holds until they end: a refusal (or a tenant over its share of generations, a 429)
    raises here, before any response starts."""
    base, adapter, system_message = await run_in_threadpool(service.models.serving_target, model, tenant)
    generation.system_message, generation.tenant = system_message, tenant or ""
    slot = _Slot(request, tenant, generation)
    try:
        items = _models(request).stream(base, adapter, generation).__aiter__()
        try:
            first = await items.__anext__()
        except StopAsyncIteration:
            first = {"error": {"status": 500, "code": "generation_failed", "param": None,
                               "message": "the model server ended the request without an answer; retry"}}
        if "error" in first:
            await items.aclose()
            raise GenerationRefused(first["error"])
    except BaseException:
        slot.release()
        raise

    async def chained() -> AsyncIterator[dict[str, Any]]:
        try:
            yield first
            async for item in items:
                if "error" in item:
                    raise GenerationRefused(item["error"])
                if "usage" in item:
                    slot.settle(item["usage"]["completion_tokens"])
                yield item
        finally:
            slot.release()
            await items.aclose()

    return chained(), slot


async def _collect_while_connected(request: Request, items: AsyncIterator[dict[str, Any]],
                                   slot: _Slot, n: int) -> tuple[list[_Choice], Usage]:
    """`_collect`, cancelled (its model server request closed) as soon as the client goes: a
    request nobody waits for does not keep generating."""
    collecting = asyncio.ensure_future(_collect(items, n))
    try:
        while not collecting.done():
            await asyncio.wait({collecting}, timeout=DISCONNECT_POLL_S)
            if not collecting.done() and await request.is_disconnected():
                collecting.cancel()
                raise ClientGone("the client closed the connection before its completion was ready")
        return collecting.result()
    finally:
        if not collecting.done():
            collecting.cancel()
        await items.aclose()
        slot.release()


class _Choice:
    """One choice's text, log-probabilities and finish reason, as the engine streamed them."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.finish_reason = "stop"


def _sse(payload: Any) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _as_openai_sends(chunk: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    """A chunk as OpenAI streams it: a delta holds only what it carries (the last one is `{}`),
    and `usage` appears (null until the last chunk) only when the request asked for it."""
    for choice in chunk["choices"]:
        if "delta" in choice:
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    if not include_usage:
        chunk.pop("usage", None)
    return chunk


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _collect(items: AsyncIterator[dict[str, Any]], n: int) -> tuple[list[_Choice], Usage]:
    choices, usage = [_Choice() for _ in range(n)], None
    async for item in items:
        if "usage" in item:
            usage = Usage(**item["usage"])
        elif "finish_reason" in item:
            choices[item["index"]].finish_reason = item["finish_reason"]
        else:
            choices[item["index"]].text.append(item["text"])
            choices[item["index"]].logprobs.extend(item.get("logprobs") or [])
    assert usage is not None
    return choices, usage


def _token(entry: dict[str, Any]) -> dict[str, Any]:
    return {"token": entry["token"], "logprob": entry["logprob"], "bytes": list(entry["token"].encode())}


def chat_logprobs(entries: list[dict[str, Any]], top: int | None) -> ChoiceLogprobs | None:
    """The engine's per-token log-probabilities as a chat choice's `logprobs` (None: not asked)."""
    if top is None:
        return None
    return ChoiceLogprobs(content=[
        TokenLogprob(**_token(e), top_logprobs=[TopLogprob(**_token(t)) for t in e["top"][:top]]) for e in entries])


def completion_logprobs(entries: list[dict[str, Any]], top: int | None, offset: int = 0) -> CompletionLogprobs | None:
    """The same as a text completion's `logprobs`; offsets count from `offset` characters."""
    if top is None:
        return None
    result = CompletionLogprobs()
    for e in entries:
        result.tokens.append(e["token"])
        result.token_logprobs.append(e["logprob"])
        result.top_logprobs.append({t["token"]: t["logprob"] for t in e["top"][:top]})
        result.text_offset.append(offset)
        offset += len(e["token"])
    return result


async def _stream_failure(exc: Exception) -> str:
    # A failure after the stream started: the status line is sent, so the error goes as an event.
    if not isinstance(exc, ServiceError):
        log.exception("a completion stream failed", exc_info=exc)
    return _sse({"error": {"type": "server_error", "code": getattr(exc, "code", "generation_failed"),
                           "message": str(exc), "param": None}})


@router.post("/chat/completions", response_model=ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "The completion, or with stream=true its chunks as server-sent events"}})
async def chat_completions(body: ChatCompletionCreate, request: Request, service: JobServiceDep,
                           tenant: CurrentTenant) -> Any:
    """A reply to `messages` from a base model or a fine-tuned model (`ft:` id, or a checkpoint's
    `...:ckpt-<step>`) of this key's tenant, in the base model's chat template."""
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    top = body.logprobs_wanted()
    generation = Generation(messages=messages, max_tokens=body.max_completion_tokens or body.max_tokens,
                            temperature=body.temperature, top_p=body.top_p, stop=body.stops(), seed=body.seed,
                            n=body.n, logprobs=top)
    items, slot = await _open(request, service, tenant, body.model, generation)
    ident, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
    if not body.stream:
        choices, usage = await _collect_while_connected(request, items, slot, body.n)
        return ChatCompletion(id=ident, created=created, model=body.model, usage=usage, choices=[
            ChatChoice(index=i, message=AssistantMessage(content="".join(c.text)), finish_reason=c.finish_reason,
                       logprobs=chat_logprobs(c.logprobs, top)) for i, c in enumerate(choices)])

    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> str:
        payload = ChatCompletionChunk(id=ident, created=created, model=body.model, usage=usage,
                                      choices=choices).model_dump(mode="json")
        return _sse(_as_openai_sends(payload, include_usage))

    async def events() -> AsyncIterator[str]:
        try:
            for index in range(body.n):
                yield chunk([ChunkChoice(index=index, delta=ChunkDelta(role="assistant", content=""))])
            async for item in items:
                if "usage" in item:
                    if include_usage:
                        yield chunk([], usage=Usage(**item["usage"]))
                elif "finish_reason" in item:
                    yield chunk([ChunkChoice(index=item["index"], delta=ChunkDelta(),
                                             finish_reason=item["finish_reason"])])
                else:
                    yield chunk([ChunkChoice(index=item["index"], delta=ChunkDelta(content=item["text"]),
                                             logprobs=chat_logprobs(item.get("logprobs") or [], top))])
        except Exception as exc:  # noqa: BLE001 - a replica lost mid-stream, a refusal: an error event
            yield await _stream_failure(exc)
        finally:
            slot.release()  # also when the client left before the items were read
        yield _sse("[DONE]")

    return _stream(events())


@router.post("/completions", response_model=Completion,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "The completion, or with stream=true its chunks as server-sent events"}})
async def completions(body: CompletionCreate, request: Request, service: JobServiceDep,
                      tenant: CurrentTenant) -> Any:
    """A continuation of `prompt` (no chat template) from a base or fine-tuned model."""
    generation = Generation(prompt=body.text(), max_tokens=body.max_tokens, temperature=body.temperature,
                            top_p=body.top_p, stop=body.stops(), seed=body.seed, n=body.n, logprobs=body.logprobs)
    items, slot = await _open(request, service, tenant, body.model, generation)
    ident, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
    if not body.stream:
        choices, usage = await _collect_while_connected(request, items, slot, body.n)
        return Completion(id=ident, created=created, model=body.model, usage=usage, choices=[
            CompletionChoice(index=i, text="".join(c.text), finish_reason=c.finish_reason,
                             logprobs=completion_logprobs(c.logprobs, body.logprobs)) for i, c in enumerate(choices)])
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        return _sse(_as_openai_sends(Completion(id=ident, created=created, model=body.model, usage=usage,
                                                choices=choices).model_dump(mode="json"), include_usage))

    async def events() -> AsyncIterator[str]:
        sent = [0] * body.n  # characters sent per choice: the text offsets of its log-probabilities
        try:
            async for item in items:
                if "usage" in item:
                    if include_usage:
                        yield chunk([], usage=Usage(**item["usage"]))
                elif "finish_reason" in item:
                    yield chunk([CompletionChoice(index=item["index"], text="", finish_reason=item["finish_reason"])])
                else:
                    index = item["index"]
                    yield chunk([CompletionChoice(index=index, text=item["text"], logprobs=completion_logprobs(
                        item.get("logprobs") or [], body.logprobs, sent[index]))])
                    sent[index] += len(item["text"])
        except Exception as exc:  # noqa: BLE001 - a replica lost mid-stream, a refusal: an error event
            yield await _stream_failure(exc)
        finally:
            slot.release()  # also when the client left before the items were read
        yield _sse("[DONE]")

    return _stream(events())


def _judge_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


async def judge_reply(request: Request, service: Any, tenant: str | None, call: dict[str, Any]) -> tuple[str, str]:
    """A model grader's judge call (service/requests/graders.py:judge_requests) answered by a model
    of this service as `tenant`, through the path of `/v1/chat/completions` (its models, slots
    and token budget): the call's key and the reply's text, or JUDGE_FAILED and why."""
    from eft.service.requests.graders import JUDGE_FAILED, judge_key

    params = call["sampling_params"]
    key = judge_key(call["model"], call["messages"], params)
    messages = [{"role": "system" if m["role"] == "developer" else m["role"], "content": _judge_text(m["content"])}
                for m in call["messages"]]
    generation = Generation(messages=messages, max_tokens=params.get("max_completions_tokens"),
                            temperature=params.get("temperature"), top_p=params.get("top_p"), seed=params.get("seed"))
    try:
        items, slot = await _open(request, service, tenant, call["model"], generation)
        choices, _ = await _collect_while_connected(request, items, slot, 1)
    except ServiceError as exc:
        return key, f"{JUDGE_FAILED}: {exc}"
    return key, "".join(choices[0].text)
