"""The tokenised-data cache: a hit returns what tokenising returns; any change to the file or
the length limit misses; bad data is never cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eft.training.data import DataError, load_examples
from eft.training.datacache import load_examples_cached

TINY = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-llama"


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
    assert len(list(cache.glob("*.pkl"))) == 1
    assert load_examples_cached(data, tokenizer, 64, str(cache)) == first == load_examples(data, tokenizer, 64)

    write(tmp_path / "d.jsonl", ["red blue", "one two four"])  # same size, other content
    changed = load_examples_cached(data, tokenizer, 64, str(cache))
    assert changed != first and changed == load_examples(data, tokenizer, 64)
    assert load_examples_cached(data, tokenizer, 32, str(cache)) == load_examples(data, tokenizer, 32)
    assert len(list(cache.glob("*.pkl"))) == 3


def test_bad_data_raises_and_is_not_cached(tokenizer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(DataError):
        load_examples_cached(str(bad), tokenizer, 64, str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").glob("*.pkl"))
