"""Alembic migrations of the job store, shipped inside the package.

The service runs them at start (`upgrade`). A database created before migrations existed (by
`metadata.create_all`) holds exactly the first revision's schema: it is stamped with that
revision, then upgraded. Add a revision for every schema change:
    .venv/bin/alembic -c service/store/migrations/alembic.ini revision -m "what changes"
(then write its upgrade/downgrade); tests/integration/test_migrations.py fails until the
migrations produce `service.store.metadata` exactly.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

HERE = Path(__file__).resolve().parent
FIRST_REVISION = "0001"
# Any fixed number: every service replica takes the same PostgreSQL advisory lock to migrate.
_PG_LOCK_KEY = 0x6566745F6D6967


def config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    return ScriptDirectory.from_config(config()).get_current_head()


def current(connection: sa.Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


@contextmanager
def _exclusive(engine: sa.Engine, connection: sa.Connection) -> Iterator[None]:
    """One migrator at a time: replicas starting together must not race on DDL."""
    if engine.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
        try:
            yield
        finally:
            connection.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def upgrade(engine: sa.Engine) -> str:
    """Bring the database to the newest revision (no-op if it is there). Returns the revision."""
    target = head()
    with engine.connect() as probe:
        if current(probe) == target:
            return target
    with engine.connect() as connection:
        with _exclusive(engine, connection):
            connection.commit()  # the lock holds at session level; migrations run in their own transaction
            if current(connection) is None and sa.inspect(connection).has_table("jobs"):
                # Created by create_all before migrations existed: that is the first revision.
                command.stamp(config(connection), FIRST_REVISION)
                connection.commit()
            command.upgrade(config(connection), "head")
            connection.commit()
    return target
