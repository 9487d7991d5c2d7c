"""Shared fixtures: an isolated EFT_HOME per test and the job-store databases under test."""

from __future__ import annotations

import contextlib
import os
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


@contextlib.contextmanager
def postgres_schema_url(prefix: str) -> Iterator[str]:
    """A URL of a fresh schema on the local PostgreSQL, dropped with everything in it after."""
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
