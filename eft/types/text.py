"""Text on the wire read with bounds: numbers out of ids with a step (`ft:...:ckpt-12`,
`<job id>:<step>`), cursors (`ftevent-42`, `Last-Event-ID: 1:40`), headers and flags; labels and
metadata without NUL and within OpenAI's lengths; free-form JSON within a depth and a size."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import AfterValidator, StringConstraints

_DECIMAL = re.compile(r"[0-9]{1,18}")


def decimal_int(text: object) -> int | None:
    """The non-negative integer `text` spells in ASCII digits (at most 18 of them, well inside
    every int64 field); None for anything else. `str.isdigit` is not that test: it passes
    superscripts and other scripts' digits ('²', '٣') that `int` refuses or reads, and any length
    (Python refuses to read more than 4,300 digits)."""
    return int(text) if isinstance(text, str) and _DECIMAL.fullmatch(text) else None


def no_nul(text: str) -> str:
    """Refuses a NUL character: no name or label means one, and PostgreSQL cannot store it."""
    if "\x00" in text:
        raise ValueError("must not contain a NUL character (\\u0000): remove it")
    return text


#: Free text a job is labelled with (names, suffixes): any character but NUL.
Label = Annotated[str, AfterValidator(no_nul)]
#: A metadata pair, bounded as OpenAI bounds them (keys 64 characters, values 512).
MetadataKey = Annotated[str, StringConstraints(max_length=64), AfterValidator(no_nul)]
MetadataValue = Annotated[str, StringConstraints(max_length=512), AfterValidator(no_nul)]
Metadata = dict[MetadataKey, MetadataValue]

#: How deep and how large a free-form JSON value a request may carry (`integrations`).
MOST_JSON_DEPTH = 8
MOST_JSON_BYTES = 16_384


def bounded_json(value: Any) -> Any:
    """Refuses a free-form JSON value nested deeper than MOST_JSON_DEPTH or larger than
    MOST_JSON_BYTES once written, checked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MOST_JSON_DEPTH:
            raise ValueError(f"is nested more than {MOST_JSON_DEPTH} levels deep: flatten it")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            stack.extend((str(k), depth) for k in item)
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            no_nul(item)
    if len(json.dumps(value)) > MOST_JSON_BYTES:
        raise ValueError(f"is over {MOST_JSON_BYTES} bytes as JSON: send less")
    return value


#: A free-form JSON object of a request, bounded.
BoundedObject = Annotated[dict[str, Any], AfterValidator(bounded_json)]
