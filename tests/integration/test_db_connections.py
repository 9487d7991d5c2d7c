"""The store survives PostgreSQL dropping its connections (a restart or failover of the
database), and retries a statement whose connection drops under it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from eft.service.db import retrying
from eft.service.store import Store
from tests.conftest import POSTGRES_URL


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_store_reconnects_after_the_server_drops_its_connections(database_url):
    store = Store(database_url)
    job = store.create_job(tenant="t", request={"model": "m"})
    with store.engine.connect() as conn:  # the store's pooled connection, by backend pid
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    admin.dispose()
    assert store.get_job(job.id).id == job.id  # pre-ping replaced the dead connection
    store.close()


class _Flaky:
    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"),
                                          connection_invalidated=True)
        return "ok"


def test_a_dropped_connection_is_retried_and_other_errors_are_not():
    flaky = _Flaky(failures=2)
    assert retrying(flaky)() == "ok" and flaky.calls == 3
    hopeless = _Flaky(failures=5)
    with pytest.raises(sa.exc.OperationalError):
        retrying(hopeless)()
    assert hopeless.calls == 3

    def integrity_error() -> None:
        raise sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    calls = []
    with pytest.raises(sa.exc.IntegrityError):
        retrying(lambda: calls.append(1) or integrity_error())()
    assert calls == [1]
