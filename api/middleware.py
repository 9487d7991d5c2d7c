"""One pure ASGI middleware around every request: its id, its log context, its metrics, and the
413 for a body declared too large.

Pure ASGI, not `BaseHTTPMiddleware`: that wraps each response in a stream passed between two
tasks, and two of them cost more CPU per request than the handler's own work.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Awaitable, Callable

import anyio.to_thread
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse

from eft.service import jsonlog, metrics
from eft.service.settings import Settings
from eft.types.text import decimal_int

REQUEST_ID = "x-request-id"

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def declared_body_too_large(path: str, headers: Headers, settings: Settings) -> str | None:
    """Why a body is refused from its Content-Length alone (None if it is not), so that the
    413 carries the error envelope; bodies without one are cut off by FastAPI's own limit."""
    upload = path.startswith(("/files", "/v1/files"))
    limit = settings.max_upload_bytes + 1024**2 if upload else settings.max_request_bytes
    declared = headers.get("content-length", "")
    if (size := decimal_int(declared)) is not None and size > limit:
        setting = "EFT_MAX_UPLOAD_BYTES" if upload else "EFT_MAX_REQUEST_BYTES"
        return f"the body has {declared} bytes, over the limit of {limit}: send less, or ask the operator to raise {setting}"
    return None


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    template = getattr(route, "path", None)
    if template is not None:
        return template
    # Mounted static files set no route; anything else unmatched is one label, so random paths
    # cannot grow the series count.
    return "/ui/static/{path}" if scope.get("path", "").startswith("/ui/static/") else "unmatched"


class RequestContext:
    """Gives each request an id (the caller's `x-request-id`, or a new one) in `request.state`,
    the log context and the response headers; counts and times it by route template."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], settings: Settings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # Sync handlers and dependencies run on the serving event loop's thread pool (anyio's,
        # 40 threads by default): sized here, on the loop that serves (`Settings.api_threads`).
        limiter = anyio.to_thread.current_default_thread_limiter()
        if limiter.total_tokens != self.settings.api_threads:
            limiter.total_tokens = self.settings.api_threads
        headers = Headers(scope=scope)
        rid = headers.get(REQUEST_ID) or f"req_{uuid.uuid4().hex[:16]}"
        scope.setdefault("state", {})["request_id"] = rid
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID] = rid
            await send(message)

        token = jsonlog.bind(request_id=rid)
        try:
            too_large = declared_body_too_large(scope["path"], headers, self.settings)
            if too_large is not None:
                body = {"error": {"type": "invalid_request_error", "code": "payload_too_large",
                                  "message": too_large, "param": "body"}}
                await JSONResponse(body, status_code=413)(scope, receive, send_with_id)
                return
            await self.app(scope, receive, send_with_id)
        finally:
            jsonlog.unbind(token)
            metrics.observe_request(scope["method"], _route_template(scope), status, time.perf_counter() - started)
