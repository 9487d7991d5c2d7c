"""The store survives PostgreSQL dropping its connections (a restart or failover of the
database), and retries a statement whose connection drops under it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from eft.service.store.db import retrying
from eft.service.store.store import Store
from tests.helpers.databases import POSTGRES_URL


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


def test_only_writes_that_are_safe_to_repeat_are_retried(tmp_path, monkeypatch):
    """A read or a compare-and-set is retried on a lost connection; an insert or increment,
    whose commit may have landed before the connection dropped, is not (no duplicate events,
    metrics or counters)."""
    store = Store(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = store.create_job(tenant="t", request={"model": "m"})
    connect, calls = store.engine.connect, []

    def dropping():
        calls.append(1)
        if len(calls) == 1:
            raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection"),
                                          connection_invalidated=True)
        return connect()

    monkeypatch.setattr(store.engine, "connect", dropping)
    monkeypatch.setattr(store.engine, "begin", lambda: _begin(dropping))
    assert store.get_job(job.id).id == job.id and len(calls) == 2  # read: retried
    calls.clear()
    with pytest.raises(sa.exc.OperationalError):
        store.append_event(job.id, "note", "once", attempt=0)
    assert len(calls) == 1  # insert: not retried
    monkeypatch.undo()
    assert [e.type for e in store.list_events(job.id)[0]] == ["created"]
    store.close()


def _begin(connect):
    import contextlib

    @contextlib.contextmanager
    def begin():
        with connect() as conn, conn.begin():
            yield conn

    return begin()
