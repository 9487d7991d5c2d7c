"""Tokenised datasets cached by content, as memory-mapped Arrow: a file is tokenised once (by
validation, or by the first rank of a node), and every worker of every attempt, and every
later job on the same data and tokenizer, maps the result instead of holding it.

An entry is a directory `<key>/` with `data.arrow` (an Arrow stream of `input_ids`, `labels`
as int32 lists and each example's `length` and `loss_tokens`; opened with Hugging Face
`datasets`, which memory-maps it, so a rank's private memory does not grow with the dataset:
pages come from the page cache and are shared by every rank of the node) and `meta.json`
(records read, lines left out). The key is a hash of the data's bytes, the tokenizer (its full
serialised form and chat template) and the tokenisation options, so a changed file or
tokenizer can never be served stale tokens. Entries are written into a temporary directory and
renamed into place; a lock file makes the ranks of a node wait for one writer instead of all
tokenising.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from eft.training.data import (
    Example, LoadedData, TokenizeOptions, check_loaded, example_tokens, load_examples, tokenize_file,
)
from eft.training.formats import content_digest

#: Bump when tokenisation or the entry layout changes meaning (the cache then misses and refills).
FORMAT = 3
DATA_FILE, META_FILE = "data.arrow", "meta.json"
WRITE_BATCH = 2048


def _tokenizer_digest(tokenizer: Any) -> str:
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    digest.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    digest.update(repr((tokenizer.eos_token_id, tokenizer.bos_token_id)).encode())
    return digest.hexdigest()


def cache_key(path: str, tokenizer: Any, options: TokenizeOptions) -> str:
    """The entry name for this data, tokenizer and options."""
    digest = hashlib.sha256(f"eft-tokens-v{FORMAT}:{options!r}:".encode())
    digest.update(_tokenizer_digest(tokenizer).encode())
    digest.update(content_digest(Path(path)).encode())
    return digest.hexdigest()[:32]


class ArrowExamples:
    """The examples of a cache entry, read row by row from the memory map."""

    def __init__(self, dataset: Any):
        self._dataset = dataset
        table = dataset.data
        self.lengths = table.column("length").to_numpy().astype(np.int64)
        self.loss_tokens = int(table.column("loss_tokens").to_numpy().sum())

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return _example(self._dataset[int(index)])

    def __iter__(self) -> Iterator[Example]:
        for row in self._dataset:
            yield _example(row)

    def __eq__(self, other: object) -> bool:
        try:
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented


def _example(row: dict[str, Any]) -> Any:
    """A row as an Example, or a preference Pair when it holds the rejected reply too."""
    if "rejected_input_ids" in row:
        from eft.training.data import Pair

        return Pair(Example(row["input_ids"], row["labels"]),
                    Example(row["rejected_input_ids"], row["rejected_labels"]))
    return Example(row["input_ids"], row["labels"])


def _open(entry: Path) -> LoadedData | None:
    try:
        meta = json.loads((entry / META_FILE).read_text())
        if meta.get("format") != FORMAT:
            return None
        import datasets

        dataset = datasets.Dataset.from_file(str(entry / DATA_FILE))
    except (OSError, ValueError, KeyError):
        return None
    return LoadedData(ArrowExamples(dataset), meta["dropped"], meta["records"])


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write(entry: Path, path: str, tokenizer: Any, options: TokenizeOptions) -> None:
    """Tokenise `path` straight into a new entry (streamed: never the whole dataset in memory)."""
    import pyarrow as pa

    pairs = options.objective == "dpo"
    columns = [("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
               ("length", pa.int32()), ("loss_tokens", pa.int32())]
    if pairs:  # a preference pair: the chosen reply in input_ids/labels, the rejected one here
        columns += [("rejected_input_ids", pa.list_(pa.int32())), ("rejected_labels", pa.list_(pa.int32()))]
    schema = pa.schema(columns)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}-"))
    try:
        records, kept, dropped, batch = 0, 0, [], []

        def flush(writer: Any) -> None:
            chosen = [e.chosen for e in batch] if pairs else batch
            columns = {
                "input_ids": [e.input_ids for e in chosen], "labels": [e.labels for e in chosen],
                "length": [example_tokens(e) for e in batch], "loss_tokens": [e.loss_tokens for e in batch],
            }
            if pairs:
                columns["rejected_input_ids"] = [e.rejected.input_ids for e in batch]
                columns["rejected_labels"] = [e.rejected.labels for e in batch]
            writer.write_batch(pa.record_batch(columns, schema=schema))
            batch.clear()

        with pa.OSFile(str(tmp / DATA_FILE), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for lineno, example in tokenize_file(path, tokenizer, options):
                records += 1
                if example is None:
                    dropped.append(lineno)
                    continue
                kept += 1
                batch.append(example)
                if len(batch) >= WRITE_BATCH:
                    flush(writer)
            if batch:
                flush(writer)
        check_loaded(path, records, kept, dropped[0] if dropped else None, options)
        (tmp / META_FILE).write_text(json.dumps({"format": FORMAT, "records": records, "dropped": dropped}))
        try:
            os.replace(tmp, entry)
        except OSError:  # another writer got there first (a non-empty directory is not replaced)
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_examples_cached(path: str, tokenizer: Any, options: TokenizeOptions | int,
                         cache_dir: str | None) -> LoadedData:
    """`load_examples`, served memory-mapped from `cache_dir` (tokenised into it first when this
    content was not seen before). Without a cache directory it tokenises into memory. Raises
    DataError as `load_examples` does (bad data is never cached)."""
    if isinstance(options, int):
        options = TokenizeOptions(max_seq_len=options)
    if not cache_dir:
        return load_examples(path, tokenizer, options)
    entry = Path(cache_dir) / cache_key(path, tokenizer, options)
    loaded = _open(entry)
    if loaded is not None:
        return loaded
    try:
        with _locked(entry.with_name(f"{entry.name}.lock")):
            if _open(entry) is None:
                shutil.rmtree(entry, ignore_errors=True)  # a stale entry of another format
                _write(entry, path, tokenizer, options)
    except OSError:
        return load_examples(path, tokenizer, options)  # a read-only or full cache: tokenise here
    loaded = _open(entry)
    return loaded if loaded is not None else load_examples(path, tokenizer, options)
