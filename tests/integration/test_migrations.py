"""Alembic migrations of the job store, on SQLite and on the local PostgreSQL.

The migrations must build exactly the schema service/store/store.py declares: a table or column added
to the store without a migration fails here. A database created before migrations existed (by
`metadata.create_all`) is stamped and upgraded in place, its rows kept.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from eft.service.store import migrations
from eft.service.store.db import make_engine
from eft.service.store.store import Store, metadata


def _differences(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), metadata)


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return migrations.current(conn)


def test_migrations_build_exactly_the_stores_schema(database_url):
    engine = make_engine(database_url)
    assert migrations.upgrade(engine) == migrations.head()
    assert _revision(engine) == migrations.head()
    assert _differences(engine) == []
    # Running them again (a second replica, a restart) changes nothing.
    assert migrations.upgrade(engine) == migrations.head()
    assert _differences(engine) == []
    engine.dispose()


def test_a_database_from_create_all_is_stamped_and_upgraded_with_its_rows(database_url):
    engine = make_engine(database_url)
    # How the store created its schema before migrations: the first revision's tables, no
    # revision recorded.
    with engine.connect() as conn:
        command.upgrade(migrations.config(conn), migrations.FIRST_REVISION)
        conn.execute(sa.text("DROP TABLE alembic_version"))
        conn.execute(sa.text("INSERT INTO jobs (id, tenant, name, status, request, attempt, step, restarts, "
                             "preemptions, resizes, lost_steps, created_at, updated_at) VALUES "
                             "('ftjob-kept', 't', 'kept', 'queued', '{\"model\": \"m\"}', 0, 0, 0, 0, 0, 0, "
                             "'2026-01-01 00:00:00', '2026-01-01 00:00:00')"))
        conn.commit()
    assert _revision(engine) is None

    store = Store(database_url)  # the service's start
    assert _revision(engine) == migrations.head()
    assert _differences(engine) == []
    assert store.get_job("ftjob-kept").name == "kept"
    store.close()
    engine.dispose()


def test_a_table_without_a_migration_is_noticed(database_url):
    engine = make_engine(database_url)
    migrations.upgrade(engine)
    extra = sa.MetaData()
    for table in metadata.tables.values():
        table.to_metadata(extra)
    sa.Table("job_tags", extra, sa.Column("id", sa.Integer, primary_key=True))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), extra)
    assert [d[0] for d in diff] == ["add_table"] and diff[0][1].name == "job_tags"
    engine.dispose()
