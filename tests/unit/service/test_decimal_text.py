"""Numbers in text from a client (ids with a step, cursors, headers) are ASCII digits or are not
numbers: `str.isdigit` passes '²' (which `int` refuses: a 500) and '٣' (which `int` reads)."""

import pytest
from starlette.datastructures import Headers

from eft.api.middleware import declared_body_too_large
from eft.service.runs.logs import parse_event_id
from eft.service.serving.model_ids import parse_model_id
from eft.service.jobs.openai import event_number
from eft.service.scheduling.queueing import _priority
from eft.service.settings import Settings
from eft.types.text import decimal_int

NOT_DECIMAL = ["²", "٣", "9" * 5000, "", " 1", "+1", "-1", "1_000", "1.0"]


@pytest.mark.parametrize("text", NOT_DECIMAL)
def test_text_that_is_not_ascii_digits_is_no_number_anywhere(text):
    assert decimal_int(text) is None
    assert parse_event_id(f"1:{text}") is None and parse_event_id(f"{text}:1") is None
    assert event_number(f"ftevent-{text}") is None
    assert parse_model_id(f"ft:tiny-llama:default:ftjob-0123456789abcdef0123:ckpt-{text}") is None
    if text.isascii() or text == "²":  # a header carries Latin-1 at most
        assert declared_body_too_large("/jobs", Headers({"content-length": text}), Settings()) is None
    assert _priority(text) == _priority(None)


def test_ascii_digits_are_read():
    assert decimal_int("0") == 0 and decimal_int("123456789012345678") == 123456789012345678
    assert decimal_int("1234567890123456789") is None  # beyond int64's fields
    assert parse_event_id("2:40") == (2, 40) and event_number("ftevent-7") == 7
    ref = parse_model_id("ft:tiny-llama:default:ftjob-0123456789abcdef0123:ckpt-12")
    assert ref is not None and ref.step == 12
    assert declared_body_too_large("/jobs", Headers({"content-length": str(10**12)}), Settings())
