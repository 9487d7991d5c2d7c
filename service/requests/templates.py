"""The model's tokenizer and chat template on the request path (part of stage 2, the checks): the
first chat or preference records of a file rendered and masked with the model's own template in
the model helper, so that a template that refuses the data's shape is a 422 at once, not a
failed job later. The tokenizers are loaded once per model directory while its files are
unchanged."""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from pathlib import Path
from typing import Any, Iterator

from eft.service.errors import Problem
from eft.service.requests.model_support import ComputedOnce
from eft.types.jobs import JobCreate
from eft.training.formats import iter_records


def tokenizer_signature(model_path: str) -> tuple[tuple[str, int, int], ...]:
    """What identifies a tokenizer's files on disk (empty for a name that is not a directory)."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")
    files = [Path(model_path) / n for n in names]
    return tuple((f.name, (st := f.stat()).st_size, st.st_mtime_ns) for f in files if f.is_file())


@functools.lru_cache(maxsize=8)
def scheduler_tokenizer(model_path: str, _signature: tuple[tuple[str, int, int], ...]) -> Any:
    """The model's tokenizer, loaded once per model directory while its files are unchanged.
    Used by the scheduler's thread only (a fast tokenizer is not safe to share across threads
    that change its truncation settings)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


#: Chat records rendered through the model's template on the request path: a template that
#: refuses the data's shape (no system role, strict alternation, no template) is a 422 at once.
TEMPLATE_SAMPLE = 32


_request_tokenizer_lock = threading.Lock()


@contextlib.contextmanager
def request_tokenizer(model_path: str) -> Iterator[Any]:
    """The model's tokenizer for request handlers (which run on many threads): loaded once per
    directory while its files are unchanged, and used by one thread at a time."""
    tokenizer = _request_tokenizer(model_path, tokenizer_signature(model_path))
    with _request_tokenizer_lock:
        yield tokenizer


def _load_request_tokenizer(model_path: str, _signature: tuple[tuple[str, int, int], ...]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


#: Loaded by one thread at a time (transformers' lazy imports), looked up without a lock.
_request_tokenizer = ComputedOnce(_load_request_tokenizer, maxsize=8)


def tokenizer_problem(model_path: str) -> Problem | None:
    """Why the model's tokenizer cannot load (then loaded and cached for `request_tokenizer`)."""
    try:
        _request_tokenizer(model_path, tokenizer_signature(model_path))
    except Exception as exc:  # noqa: BLE001 - any reason a tokenizer cannot load is the model's
        return Problem("model", "tokenizer_unavailable",
                       f"cannot load the model's tokenizer ({type(exc).__name__}: {str(exc)[:300]}): "
                       "a model directory needs its tokenizer files (tokenizer.json, "
                       "tokenizer_config.json) to train on chat records")
    return None


def check_chat_template(model_path: str, path: Path, param: str, req: JobCreate) -> list[Problem]:
    """The first chat records of a file rendered and masked with the model's own template.

    Remembered per file version, tokenizer files and options: rendering is most of a create's
    CPU, and jobs are created again and again on the same file and model."""
    try:
        stat = path.stat()
    except OSError:
        stat = None
    if stat is None:
        return _check_chat_template(model_path, path, param, req.data.train_on, req.data.system_message,
                                    tuple(sorted(req.data.columns.items())))
    return list(_checked_chat_template(model_path, tokenizer_signature(model_path), str(path),
                                       (stat.st_size, stat.st_mtime_ns, stat.st_ino), param, req.data.train_on,
                                       req.data.system_message, tuple(sorted(req.data.columns.items()))))


@functools.lru_cache(maxsize=256)
def _checked_chat_template(model_path: str, _signature: Any, path: str, _version: tuple[int, int, int], param: str,
                           train_on: str, system_message: str, columns: tuple[tuple[str, str], ...]) -> tuple[Problem, ...]:
    return tuple(_check_chat_template(model_path, Path(path), param, train_on, system_message, columns))


def _check_chat_template(model_path: str, path: Path, param: str, train_on: str, system_message: str,
                         columns: tuple[tuple[str, str], ...]) -> list[Problem]:
    """`_render_chat_sample` in the model helper (service/isolation.py): a tokenizer and its
    template need transformers, which the API's process does not import."""
    from eft.service import isolation
    return isolation.run(_render_chat_sample, model_path, path, param, train_on, system_message, columns,
                         pool="model", param=param)


def _render_chat_sample(model_path: str, path: Path, param: str, train_on: str, system_message: str,
                        columns: tuple[tuple[str, str], ...]) -> list[Problem]:
    from eft.training.chat import TemplateError, tokenize_chat
    from eft.training.data import tokenize_preference
    from eft.training.formats import check_record, is_preference

    unavailable = tokenizer_problem(model_path)
    if unavailable is not None:
        return [unavailable]
    with request_tokenizer(model_path) as tokenizer:
        for lineno, record, error in itertools.islice(iter_records(path, columns=dict(columns)), TEMPLATE_SAMPLE):
            if error or not isinstance(record, dict):
                continue
            try:
                if is_preference(record):
                    if not check_record(record)[1]:
                        tokenize_preference(tokenizer, record, 1 << 30, system_message)
                elif "messages" in record:
                    tokenize_chat(tokenizer, record["messages"], record.get("tools"), train_on, system_message)
            except TemplateError as exc:
                return [Problem(f"{param}:line {lineno}:{exc.field}", f"chat_{exc.rule}",
                                f"{path.name} line {lineno}: {exc}")]
    return []
