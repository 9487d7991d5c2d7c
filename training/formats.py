"""Dataset record shapes and their schema checks. Pure Python (json only), so the service can
check an upload or a request's files without importing torch.

Three shapes, one per JSONL line, detected per record:
- chat: `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...],
  "tools": [...]}` (OpenAI's shape: an assistant message may carry `tool_calls` and a `weight`
  of 0 or 1); rendered with the model's own chat template, which may add rules of its own
  (alternation, no system role). The loss is on assistant turns by default.
- prompt/completion: `{"prompt": str, "completion": str}`; the loss is on the completion only.
- text: `{"text": str}`; the loss is on every token.
- classification: `{"text": str, "label": str | int}`; trained as prompt `text`, completion
  `label`, so the loss is on the label only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class RecordProblem:
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.message}"


@dataclass
class ScanResult:
    """What a full pass over a JSONL file found."""

    records: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    problems: list[RecordProblem] = field(default_factory=list)
    problems_total: int = 0


def detect_format(record: Any) -> str | None:
    """Returns 'chat', 'prompt_completion', 'text', or None when no shape matches."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "chat"
    if "prompt" in record or "completion" in record:
        return "prompt_completion"
    if "text" in record and "label" in record:
        return "classification"
    if "text" in record:
        return "text"
    return None


def _check_text(value: Any, name: str, out: list[tuple[str, str]]) -> None:
    if not isinstance(value, str):
        out.append((name, f"must be a string, got {type(value).__name__}"))
    elif not value.strip():
        out.append((name, "is empty or whitespace only"))


def _check_message(i: int, msg: Any, out: list[tuple[str, str]]) -> None:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        out.append((where, "must be an object with role and content"))
        return
    role = msg.get("role")
    if role not in ROLES:
        out.append((f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}"))
    if role == "assistant" and msg.get("tool_calls") and msg.get("content") in (None, ""):
        pass  # a tool call: the call is what the assistant says
    else:
        _check_text(msg.get("content"), f"{where}.content", out)
    if "tool_calls" in msg and not isinstance(msg["tool_calls"], list):
        out.append((f"{where}.tool_calls", "must be a list of tool calls"))
    if "weight" in msg:
        if role != "assistant":
            out.append((f"{where}.weight", "only assistant messages carry a weight"))
        elif msg["weight"] not in (0, 1) or isinstance(msg["weight"], bool):
            out.append((f"{where}.weight", f"must be 0 (not trained) or 1 (trained), got {msg['weight']!r}"))


def _check_chat(record: dict[str, Any], out: list[tuple[str, str]]) -> None:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        out.append(("messages", "must be a non-empty list of {role, content} objects"))
        return
    for i, msg in enumerate(messages):
        _check_message(i, msg, out)
    if not any(isinstance(m, dict) and m.get("role") == "assistant" and m.get("weight", 1) != 0
               for m in messages):
        out.append(("messages", "has no assistant message with weight 1, so nothing to learn from"))
    first = next((i for i, m in enumerate(messages)
                  if isinstance(m, dict) and m.get("role") != "system"), None)
    if first is not None and messages[first].get("role") != "user":
        out.append((f"messages[{first}].role", "expected 'user' here: a conversation starts with a "
                    "user message, after an optional system message"))
    tools = record.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        out.append(("tools", "must be a list of tool definitions (objects)"))


def check_record(record: Any) -> tuple[str | None, list[tuple[str, str]]]:
    """Returns (format, [(field, message), ...]) for one parsed JSONL record."""
    fmt = detect_format(record)
    out: list[tuple[str, str]] = []
    if fmt is None:
        out.append((
            "record",
            "must be an object with 'messages' (chat), 'prompt' and 'completion', 'text', "
            "or 'text' and 'label' (classification)",
        ))
    elif fmt == "chat":
        _check_chat(record, out)
    elif fmt == "prompt_completion":
        for key in ("prompt", "completion"):
            if key not in record:
                out.append((key, "is missing"))
            else:
                _check_text(record[key], key, out)
    elif fmt == "classification":
        _check_text(record["text"], "text", out)
        label = record["label"]
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            out.append(("label", f"must be a string or an integer, got {type(label).__name__}"))
        elif isinstance(label, str) and not label.strip():
            out.append(("label", "is empty or whitespace only"))
    else:
        _check_text(record["text"], "text", out)
    return fmt, out


def iter_jsonl(path: Path, utf8_errors_per_line: bool = False) -> Iterator[tuple[int, Any, str | None]]:
    """Yields (line number, parsed record or None, parse error or None), skipping blank lines.

    Raises UnicodeDecodeError for bytes that are not UTF-8, unless `utf8_errors_per_line`,
    which reports them as that line's parse error instead."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if not utf8_errors_per_line:
                    raise
                yield lineno, None, f"is not valid UTF-8 (byte {exc.start + 1}): save the file as UTF-8"
                continue
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except json.JSONDecodeError as exc:
                yield lineno, None, f"is not valid JSON: {exc.msg} at column {exc.colno}"
            except RecursionError:
                yield lineno, None, "is nested too deeply to parse: flatten the record"


def scan_jsonl(path: Path, max_problems: int = 20) -> ScanResult:
    """Parse and schema-check every line of a JSONL dataset.

    Returns a ScanResult with up to `max_problems` problems (and the total count). Raises
    OSError or UnicodeDecodeError when the file cannot be read as UTF-8 text.
    """
    result = ScanResult()
    for lineno, record, parse_error in iter_jsonl(path):
        result.records += 1
        found: list[tuple[str, str]]
        if parse_error:
            found = [("line", parse_error)]
        else:
            fmt, found = check_record(record)
            if fmt and not found:
                result.formats[fmt] = result.formats.get(fmt, 0) + 1
        result.problems_total += len(found)
        for field_name, message in found:
            if len(result.problems) < max_problems:
                result.problems.append(RecordProblem(lineno, field_name, message))
    return result
