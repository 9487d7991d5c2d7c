"""Structured JSON logs for the service and the job's driver.

Each record is one JSON object per line with `time`, `level`, `logger`, `message` and the
context the process knows: `job_id`, `attempt`, `rank` (the driver and its actors), and
`request_id` (the service, for the request being handled). Context lives in contextvars, so
concurrent requests never see each other's ids. Only the `eft.*` loggers are configured:
Ray's and uvicorn's own logging is left as Ray sets it up.

    configure()                       # once per process, at start
    bind(job_id="ftjob-...", attempt=1)
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

CONTEXT_KEYS = ("job_id", "attempt", "rank", "request_id")
_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("eft_log_context", default={})


def bind(**values: Any) -> contextvars.Token:
    """Add fields to every record logged in this context. Returns a token for `unbind`."""
    return _context.set({**_context.get(), **{k: v for k, v in values.items() if v is not None}})


def unbind(token: contextvars.Token) -> None:
    _context.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_context.get(),
        }
        for key in CONTEXT_KEYS:
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: int = logging.INFO, stream: Any = None) -> None:
    """Send the `eft.*` loggers to `stream` (stderr by default) as JSON lines. Idempotent."""
    logger = logging.getLogger("eft")
    for handler in list(logger.handlers):
        if getattr(handler, "_eft_json", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._eft_json = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
