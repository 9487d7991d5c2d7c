"""Tokenised datasets cached by content: a file is tokenised once, by validation, and every
worker of every attempt (and every later job on the same data and tokenizer) reads the result.

The key is a hash of the file's bytes, the tokenizer (its full serialised form and chat
template) and the tokenisation options (`max_seq_len`, what is trained), so a changed file or tokenizer can never be served stale tokens.
Entries are written atomically (temporary file, then rename): concurrent writers are safe.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from eft.training.data import Example, LoadedData, TokenizeOptions, load_examples
from eft.training.formats import content_digest

#: Bump when tokenisation changes meaning (the cache then misses and refills).
FORMAT = 2


def _tokenizer_digest(tokenizer: Any) -> str:
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    digest.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    digest.update(repr((tokenizer.eos_token_id, tokenizer.bos_token_id)).encode())
    return digest.hexdigest()


def cache_key(path: str, tokenizer: Any, options: TokenizeOptions) -> str:
    """The entry name for this file, tokenizer and options."""
    digest = hashlib.sha256(f"eft-tokens-v{FORMAT}:{options!r}:".encode())
    digest.update(_tokenizer_digest(tokenizer).encode())
    digest.update(content_digest(Path(path)).encode())
    return digest.hexdigest()[:32]


def load_examples_cached(path: str, tokenizer: Any, options: TokenizeOptions | int,
                         cache_dir: str | None) -> LoadedData:
    """`load_examples`, served from `cache_dir` when this content was tokenised before.

    Without a cache directory it tokenises. Raises DataError as `load_examples` does (bad
    data is never cached).
    """
    if isinstance(options, int):
        options = TokenizeOptions(max_seq_len=options)
    if not cache_dir:
        return load_examples(path, tokenizer, options)
    entry = Path(cache_dir) / f"{cache_key(path, tokenizer, options)}.pkl"
    try:
        with open(entry, "rb") as handle:
            rows, dropped, records = pickle.load(handle)
            return LoadedData([Example(ids, labels) for ids, labels in rows], dropped, records)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError):
        pass  # absent or unreadable: tokenise and (re)write it
    loaded = load_examples(path, tokenizer, options)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            rows = [(e.input_ids, e.labels) for e in loaded.examples]
            pickle.dump((rows, loaded.dropped, loaded.records), handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, entry)
    except OSError:
        pass  # a read-only or full cache only costs the next reader a tokenisation
    return loaded
