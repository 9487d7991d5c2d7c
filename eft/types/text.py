"""Numbers read out of text on the wire: ids with a step (`ft:...:ckpt-12`, `<job id>:<step>`),
cursors (`ftevent-42`, `Last-Event-ID: 1:40`), headers and flags."""

from __future__ import annotations

import re

_DECIMAL = re.compile(r"[0-9]{1,18}")


def decimal_int(text: object) -> int | None:
    """The non-negative integer `text` spells in ASCII digits (at most 18 of them, well inside
    every int64 field); None for anything else. `str.isdigit` is not that test: it passes
    superscripts and other scripts' digits ('²', '٣') that `int` refuses or reads, and any length
    (Python refuses to read more than 4,300 digits)."""
    return int(text) if isinstance(text, str) and _DECIMAL.fullmatch(text) else None
