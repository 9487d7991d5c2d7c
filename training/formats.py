"""Dataset files, record shapes and their schema checks. No torch here, so the service can check
an upload or a request's files without importing it.

Files: JSONL (`.jsonl`, `.json` with one record per line), Parquet (`.parquet`), CSV (`.csv`,
with `messages`/`tools`/`conversations` cells holding JSON) and `datasets` directories written
by `save_to_disk` (the `train` split of a DatasetDict). Every reader yields records numbered
from 1 (lines, or rows) so problems name where they are.

Shapes, detected per record after an optional column mapping (`{"prompt": "question"}` reads
the prompt from the column `question`):

Three shapes, one per JSONL line, detected per record:
- chat: `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...],
  "tools": [...]}` (OpenAI's shape: an assistant message may carry `tool_calls` and a `weight`
  of 0 or 1); rendered with the model's own chat template, which may add rules of its own
  (alternation, no system role). The loss is on assistant turns by default.
- prompt/completion: `{"prompt": str, "completion": str}`; the loss is on the completion only.
- text: `{"text": str}`; the loss is on every token.
- classification: `{"text": str, "label": str | int}`; trained as prompt `text`, completion
  `label`, so the loss is on the label only.
- preference (DPO jobs only): `{"input": {"messages": [...], "tools": [...]}, "preferred_output":
  [assistant message], "non_preferred_output": [assistant message]}` (checked below; DPO: training/preference.py).
- Alpaca: `{"instruction": str, "input": str, "output": str}` and ShareGPT:
  `{"conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}]}` are read as chat.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

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
    """Returns 'chat', 'preference', 'prompt_completion', 'classification', 'text', or None when
    no shape matches."""
    if not isinstance(record, dict):
        return None
    if "preferred_output" in record or "non_preferred_output" in record:
        return "preference"
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


#: Messages one chat record may hold (an agent's longest traces stay well under it).
MOST_MESSAGES = 1024


def _check_chat(record: dict[str, Any], out: list[tuple[str, str]]) -> None:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        out.append(("messages", "must be a non-empty list of {role, content} objects"))
        return
    if len(messages) > MOST_MESSAGES:
        out.append(("messages", f"has {len(messages)} messages, more than the {MOST_MESSAGES} a record may "
                    "hold: split the conversation into several records"))
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
            "'text' and 'label' (classification), or 'input', 'preferred_output' and "
            "'non_preferred_output' (preference pairs)",
        ))
    elif fmt == "chat":
        _check_chat(record, out)
    elif fmt == "preference":
        check_preference(record, out)
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


#: File suffixes read as datasets (anything else is read as JSONL).
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
#: Markers of a `datasets` directory (`Dataset.save_to_disk` / `DatasetDict.save_to_disk`).
ARROW_MARKERS = ("state.json", "dataset_dict.json", "dataset_info.json")
_JSON_CELLS = ("messages", "tools", "conversations")
#: The largest CSV cell read (Python's default, 128 KiB, is less than one long document); a larger
#: cell is a csv.Error naming the limit.
MOST_CSV_CELL_CHARS = 16 * 1024**2
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system",
                  "tool": "tool", "observation": "tool", "function_response": "tool",
                  "function_call": "assistant"}


def data_kind(path: Path) -> str:
    """"jsonl", "parquet", "csv" or "arrow" (a `datasets` directory)."""
    if path.is_dir():
        return "arrow"
    return {".parquet": "parquet", ".csv": "csv"}.get(path.suffix.lower(), "jsonl")


def is_dataset_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in ARROW_MARKERS)


def content_digest(path: Path) -> str:
    """sha256 of a data file's bytes, or of every file of a dataset directory (names and bytes)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def content_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def normalize(record: Any, columns: Mapping[str, str] | None = None) -> Any:
    """A record in a canonical shape: mapped columns renamed, Alpaca and ShareGPT as chat."""
    if not isinstance(record, dict):
        return record
    if columns:
        record = dict(record)
        for canonical, source in columns.items():
            if source in record and source != canonical:
                record[canonical] = record.pop(source)
    if "messages" in record or "prompt" in record or "text" in record or "preferred_output" in record:
        return record
    if isinstance(record.get("conversations"), list):
        messages = []
        for turn in record["conversations"]:
            if not isinstance(turn, dict):
                messages.append(turn)
                continue
            role = turn.get("from", turn.get("role"))
            message = {"role": SHAREGPT_ROLES.get(str(role).lower(), role),
                       "content": turn.get("value", turn.get("content"))}
            if "weight" in turn:
                message["weight"] = turn["weight"]
            messages.append(message)
        out = {"messages": messages}
        if "tools" in record:
            out["tools"] = record["tools"]
        return out
    if "instruction" in record and "output" in record:
        extra = record.get("input")
        user = f"{record['instruction']}\n\n{extra}" if isinstance(extra, str) and extra.strip() else record["instruction"]
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": record["output"]}]
        if isinstance(record.get("system"), str) and record["system"].strip():
            messages.insert(0, {"role": "system", "content": record["system"]})
        return {"messages": messages}
    return record


#: Parquet is checked from its footer before a row is read (rows, columns), and what it decodes
#: to is counted as it is read: a few hundred bytes of dictionary or run-length encoding can
#: stand for gigabytes (a 619-byte file decoded to 1.1 GB). A file decoding to more than
#: PARQUET_EXPANSION times its size (and PARQUET_DECODED_FLOOR) is refused.
MOST_PARQUET_ROWS = 10_000_000
MOST_PARQUET_COLUMNS = 1000
PARQUET_EXPANSION = 64
PARQUET_DECODED_FLOOR = 256 * 1024**2


def _decoded_bytes(batch: Any) -> int:
    """What a batch's values take once decoded (a dictionary column's values repeated)."""
    import pyarrow as pa

    return sum(column.dictionary_decode().nbytes if pa.types.is_dictionary(column.type) else column.nbytes
               for column in batch.columns)


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """Rows of a Parquet file. Raises ValueError naming the limit when its footer says it has
    too many rows or columns, or when it decodes to far more than its size."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    meta = source.metadata
    if meta.num_rows > MOST_PARQUET_ROWS:
        raise ValueError(f"it has {meta.num_rows:,} rows, more than the {MOST_PARQUET_ROWS:,} a dataset file may "
                         "hold: split it into several jobs' files")
    if meta.num_columns > MOST_PARQUET_COLUMNS:
        raise ValueError(f"it has {meta.num_columns:,} columns, more than {MOST_PARQUET_COLUMNS:,}: write only "
                         "the columns training reads")
    budget = max(PARQUET_DECODED_FLOOR, PARQUET_EXPANSION * path.stat().st_size)
    decoded, row = 0, 0
    for batch in source.iter_batches(batch_size=256):
        decoded += _decoded_bytes(batch)
        if decoded > budget:
            raise ValueError(f"it decodes to more than {budget:,} bytes ({PARQUET_EXPANSION}x its size on disk) "
                             f"by row {row + batch.num_rows:,}: a file this compressible is refused; write it "
                             "without repeating values through a dictionary, or as JSONL")
        for record in batch.to_pylist():
            row += 1
            yield row, record, None


def _iter_csv(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    csv.field_size_limit(MOST_CSV_CELL_CHARS)
    with open(path, newline="", encoding="utf-8-sig") as handle:
        for row, record in enumerate(csv.DictReader(handle), start=1):
            error = None
            for key in _JSON_CELLS:
                value = record.get(key)
                if isinstance(value, str) and value.strip().startswith(("[", "{")):
                    try:
                        record[key] = json.loads(value)
                    except json.JSONDecodeError as exc:
                        error = f"column {key!r} is not valid JSON: {exc.msg} at column {exc.colno}"
            yield row, (None if error else record), error


def _iter_arrow(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        split = "train" if "train" in loaded else next(iter(loaded))
        loaded = loaded[split]
    for row, record in enumerate(loaded, start=1):
        yield row, record, None


def iter_records(path: Path, utf8_errors_per_line: bool = False,
                 columns: Mapping[str, str] | None = None) -> Iterator[tuple[int, Any, str | None]]:
    """(line or row number, record in canonical shape or None, read error or None) of any
    supported data file or directory. Raises OSError / UnicodeDecodeError as `iter_jsonl`."""
    kind = data_kind(path)
    if kind == "parquet":
        source = _iter_parquet(path)
    elif kind == "csv":
        source = _iter_csv(path)
    elif kind == "arrow":
        if not is_dataset_dir(path):
            raise OSError(f"{path.name} is a directory but not a `datasets` save_to_disk directory")
        source = _iter_arrow(path)
    else:
        source = iter_jsonl(path, utf8_errors_per_line)
    for number, record, error in source:
        yield number, (normalize(record, columns) if error is None else None), error


def scan_jsonl(path: Path, max_problems: int = 20, columns: Mapping[str, str] | None = None) -> ScanResult:
    """Parse and schema-check every record of a dataset (any supported file or directory).

    Returns a ScanResult with up to `max_problems` problems (and the total count). Raises
    OSError or UnicodeDecodeError when the file cannot be read as UTF-8 text.
    """
    result = ScanResult()
    for lineno, record, parse_error in iter_records(path, columns=columns):
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


# --- preference pairs (DPO) ---------------------------------------------------------------

#: Keys of a preference record.
INPUT, PREFERRED, NON_PREFERRED = "input", "preferred_output", "non_preferred_output"



def is_preference(record: Any) -> bool:
    return isinstance(record, dict) and (PREFERRED in record or NON_PREFERRED in record)


def check_preference(record: dict[str, Any], out: list[tuple[str, str]]) -> None:
    """Per-field problems of a preference record, as (field, message), appended to `out`."""
    prompt = record.get(INPUT)
    if not isinstance(prompt, dict) or not isinstance(prompt.get("messages"), list) or not prompt["messages"]:
        out.append((f"{INPUT}.messages", "must be a non-empty list of {role, content} objects: the conversation "
                    "the two replies answer"))
    else:
        inner: list[tuple[str, str]] = []
        for i, message in enumerate(prompt["messages"]):
            _check_message(i, message, inner)
        out.extend((f"{INPUT}.{field}", message) for field, message in inner)
        last = prompt["messages"][-1]
        if isinstance(last, dict) and last.get("role") == "assistant":
            out.append((f"{INPUT}.messages[{len(prompt['messages']) - 1}].role",
                        "the prompt must end with a user (or tool) message: the replies are the assistant's turn"))
        tools = prompt.get("tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            out.append((f"{INPUT}.tools", "must be a list of tool definitions (objects)"))
    for key in (PREFERRED, NON_PREFERRED):
        reply = record.get(key)
        if not isinstance(reply, list) or len(reply) != 1:
            out.append((key, "must be a list holding one assistant message, e.g. "
                        '[{"role": "assistant", "content": "..."}]'))
            continue
        inner = []
        _check_message(0, reply[0], inner)
        out.extend((f"{key}[0]{field.removeprefix('messages[0]')}", message) for field, message in inner)
        if isinstance(reply[0], dict) and reply[0].get("role") != "assistant":
            out.append((f"{key}[0].role", f"must be 'assistant', got {reply[0].get('role')!r}"))
        if isinstance(reply[0], dict) and "weight" in reply[0]:
            out.append((f"{key}[0].weight", "a preferred or non-preferred reply carries no weight: remove it"))
    if (isinstance(record.get(PREFERRED), list) and isinstance(record.get(NON_PREFERRED), list)
            and record[PREFERRED] == record[NON_PREFERRED]):
        out.append((NON_PREFERRED, "is the same reply as preferred_output: nothing to prefer"))
