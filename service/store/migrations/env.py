"""Alembic environment: runs on the connection `service.migrations.upgrade` hands over, or on
`EFT_DATABASE_URL` when run from the `alembic` command line."""

from __future__ import annotations

from alembic import context

from eft.service.store.store import metadata


def _run(connection) -> None:  # noqa: ANN001
    context.configure(connection=connection, target_metadata=metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    from eft.service.store.db import make_engine
    from eft.service.settings import get_settings

    engine = make_engine(get_settings().resolved_database_url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
