"""The tokenised-data cache: a hit returns what tokenising returns; any change to the file or
the length limit misses; bad data is never cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eft.training.data import DataError, load_examples
from eft.training.datacache import load_examples_cached
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY)


def write(path: Path, completions: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": "say", "completion": c}) + "\n" for c in completions))
    return str(path)


def test_hit_equals_fresh_tokenisation_and_changes_miss(tokenizer, tmp_path: Path) -> None:
    data, cache = write(tmp_path / "d.jsonl", ["red blue", "one two three"]), tmp_path / "cache"
    first = load_examples_cached(data, tokenizer, 64, str(cache))
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
    assert load_examples_cached(data, tokenizer, 64, str(cache)) == first == load_examples(data, tokenizer, 64)

    write(tmp_path / "d.jsonl", ["red blue", "one two four"])  # same size, other content
    changed = load_examples_cached(data, tokenizer, 64, str(cache))
    assert changed != first and changed == load_examples(data, tokenizer, 64)
    assert load_examples_cached(data, tokenizer, 32, str(cache)) == load_examples(data, tokenizer, 32)
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 3


def test_bad_data_raises_and_is_not_cached(tokenizer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(DataError):
        load_examples_cached(str(bad), tokenizer, 64, str(tmp_path / "cache"))
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]


def test_entries_are_memory_mapped_arrow_matching_memory(tokenizer, tmp_path: Path) -> None:
    import numpy as np

    from eft.training.datacache import ArrowExamples

    data = write(tmp_path / "d.jsonl", ["red blue", "one two three", "four"])
    cached = load_examples_cached(data, tokenizer, 64, str(tmp_path / "cache"))
    fresh = load_examples(data, tokenizer, 64)
    assert isinstance(cached.examples, ArrowExamples)
    assert cached.examples._dataset.cache_files  # backed by the file on disk, not loaded into memory
    assert list(cached.examples) == fresh.examples and cached.examples[1:3] == fresh.examples[1:3]
    assert np.array_equal(cached.lengths, fresh.lengths) and cached.loss_tokens == fresh.loss_tokens


def test_ranks_of_a_node_tokenise_once(tokenizer, tmp_path: Path) -> None:
    """Concurrent loaders (the ranks of a node) wait on the entry's lock: one tokenises."""
    from concurrent.futures import ThreadPoolExecutor
    from unittest import mock

    from eft.training import datacache

    data = write(tmp_path / "d.jsonl", ["red blue"] * 50)
    with mock.patch.object(datacache, "_write", wraps=datacache._write) as writes:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: load_examples_cached(data, tokenizer, 64, str(tmp_path / "c")),
                                    range(4)))
    assert writes.call_count == 1
    assert all(r.examples == results[0].examples for r in results)
