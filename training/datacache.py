"""Tokenised datasets cached by content: a file is tokenised once, by validation, and every
worker of every attempt (and every later job on the same data and tokenizer) reads the result.

The key is a hash of the file's bytes, the tokenizer (its full serialised form and chat
template) and `max_seq_len`, so a changed file or tokenizer can never be served stale tokens.
Entries are written atomically (temporary file, then rename): concurrent writers are safe.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from eft.training.data import Example, load_examples

#: Bump when tokenisation changes meaning (the cache then misses and refills).
FORMAT = 1


def _tokenizer_digest(tokenizer: Any) -> str:
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    digest.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    digest.update(repr((tokenizer.eos_token_id, tokenizer.bos_token_id)).encode())
    return digest.hexdigest()


def cache_key(path: str, tokenizer: Any, max_seq_len: int) -> str:
    """The entry name for this file, tokenizer and length limit."""
    digest = hashlib.sha256(f"eft-tokens-v{FORMAT}:{max_seq_len}:".encode())
    digest.update(_tokenizer_digest(tokenizer).encode())
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:32]


def load_examples_cached(path: str, tokenizer: Any, max_seq_len: int, cache_dir: str | None) -> list[Example]:
    """`load_examples`, served from `cache_dir` when this content was tokenised before.

    Without a cache directory it tokenises. Raises DataError as `load_examples` does (bad
    data is never cached).
    """
    if not cache_dir:
        return load_examples(path, tokenizer, max_seq_len)
    entry = Path(cache_dir) / f"{cache_key(path, tokenizer, max_seq_len)}.pkl"
    try:
        with open(entry, "rb") as handle:
            return [Example(ids, labels) for ids, labels in pickle.load(handle)]
    except (OSError, pickle.UnpicklingError, EOFError, ValueError):
        pass  # absent or unreadable: tokenise and (re)write it
    examples = load_examples(path, tokenizer, max_seq_len)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            pickle.dump([(e.input_ids, e.labels) for e in examples], handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, entry)
    except OSError:
        pass  # a read-only or full cache only costs the next reader a tokenisation
    return examples
