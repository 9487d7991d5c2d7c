"""Shared fixtures: an isolated EFT_HOME per test and the job-store databases under test."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from eft.service.settings import get_settings

POSTGRES_URL = os.environ.get(
    "EFT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture
def eft_home(tmp_path, monkeypatch):
    """A fresh EFT_HOME with a `data/` root; settings are re-read from the environment."""
    home = tmp_path / "eft-home"
    (home / "data").mkdir(parents=True)
    monkeypatch.setenv("EFT_HOME", str(home))
    monkeypatch.delenv("EFT_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request, tmp_path):
    """A job-store URL: a SQLite file, or a throwaway schema on the local PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    with postgres_schema_url("eft_test") as url:
        yield url


@functools.cache
def _postgres_listening() -> bool:
    """Whether anything listens where EFT_TEST_POSTGRES_URL points (not whether it lets us in:
    a server that refuses the tests' credentials is a failure, not a skip)."""
    url = sa.engine.make_url(POSTGRES_URL)
    try:
        socket.create_connection((url.host or "127.0.0.1", url.port or 5432), timeout=3).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def postgres_schema_url(prefix: str) -> Iterator[str]:
    """A URL of a fresh schema on the local PostgreSQL, dropped with everything in it after.
    Skips the test, saying why, only when no PostgreSQL server is there at all."""
    if not _postgres_listening():
        pytest.skip(f"no PostgreSQL server at {POSTGRES_URL}: start one, or point EFT_TEST_POSTGRES_URL at one")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


_SUITE_START = time.monotonic()
_SECONDS_BY_DIRECTORY: dict[str, float] = collections.defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each test's setup, call and teardown time to its directory (unit, integration, e2e)."""
    parts = report.nodeid.split("/")
    _SECONDS_BY_DIRECTORY[parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    """The suite's time per directory and in all, as the last lines of every run."""
    rows = ", ".join(f"{name} {seconds / 60:.1f} min" for name, seconds in sorted(_SECONDS_BY_DIRECTORY.items()))
    terminalreporter.write_line(f"suite time: {(time.monotonic() - _SUITE_START) / 60:.1f} min ({rows})")


def reference_reply(base_dir, adapter, messages=None, prompt=None, max_new_tokens=16, state=None) -> str:
    """What plain transformers (+ PEFT) answer greedily from the model in `base_dir` (with the
    adapter in `adapter`, its trainable weights replaced by `state` when given): the text the
    service's completions must give."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    if adapter is not None and state is None:
        model = PeftModel.from_pretrained(model, str(adapter))
    elif adapter is not None:
        model = get_peft_model(model, LoraConfig.from_pretrained(str(adapter)))
        params = dict(model.named_parameters())
        assert set(state) <= set(params) and {n for n in params if ".lora_" in n} <= set(state)
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
    if messages is not None:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
