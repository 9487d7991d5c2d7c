"""Structured logs: one JSON object per line with the bound job and request context."""

import io
import json
import logging

import pytest

from eft.service import jsonlog
@pytest.fixture(autouse=True)
def _restore_eft_logger():
    logger = logging.getLogger("eft")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]


def test_records_are_json_with_bound_context_and_unbind_restores_it():
    stream = io.StringIO()
    jsonlog.configure(stream=stream)
    log = logging.getLogger("eft.test")
    outer = jsonlog.bind(job_id="ftjob-a", attempt=2)
    inner = jsonlog.bind(request_id="req_1")
    log.info("hello %s", "world")
    jsonlog.unbind(inner)
    log.warning("after", extra={"rank": 0})
    jsonlog.unbind(outer)
    log.info("bare")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "hello world" and first["logger"] == "eft.test" and first["level"] == "info"
    assert (first["job_id"], first["attempt"], first["request_id"]) == ("ftjob-a", 2, "req_1")
    assert "request_id" not in second and second["rank"] == 0 and second["job_id"] == "ftjob-a"
    assert "job_id" not in third and third["time"].endswith("+00:00")
    jsonlog.configure(stream=stream)  # idempotent: still one handler
    assert sum(getattr(h, "_eft_json", False) for h in logging.getLogger("eft").handlers) == 1
