"""The local PostgreSQL the tests use beside SQLite: a throwaway schema per use."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

POSTGRES_URL = os.environ.get(
    "EFT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


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
