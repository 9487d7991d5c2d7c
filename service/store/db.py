"""Database engines for the job store: pooling, pre-ping, and a retry on transient disconnects.

PostgreSQL connections are pooled (sizes from `EFT_DB_POOL_SIZE`, `EFT_DB_MAX_OVERFLOW`,
`EFT_DB_POOL_RECYCLE_S`) and pinged at checkout, so a connection the server or a proxy closed
is replaced before use. A statement that still loses its connection (the database fails over
mid-call) is retried on a fresh one by `retry_on_disconnect`, when repeating it is safe: reads,
compare-and-set updates and plain updates are; inserts and increments (`once`) are not, since
the lost connection may have committed them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import sqlalchemy as sa
from sqlalchemy import event as sa_event


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(value: datetime | None) -> datetime | None:
    """A stored time as UTC: SQLite hands back naive datetimes; everything stored is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


log = logging.getLogger("eft.db")
T = TypeVar("T")
RETRY_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.5


def _wal(cursor) -> None:  # noqa: ANN001
    """Put the database in WAL mode (it stays so: later connections only read the mode). Two
    processes opening a new database at once (two replicas, two jobs' drivers) can both try to
    switch it, and SQLite answers the loser's switch with "database is locked" at once, without
    its busy handler: the switch is retried for up to 30 s, as the busy timeout would wait."""
    import sqlite3
    import time

    if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
        return
    deadline = time.monotonic() + 30
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def make_engine(url: str) -> sa.Engine:
    """An engine for `url`: SQLite with WAL for one machine, or a pooled server database."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # The job store holds every tenant's requests: readable by its owner only. SQLite
            # gives its -wal and -shm files the database file's mode. Only a file that does not
            # exist yet is touched: closing any other descriptor of an open SQLite file drops
            # the process's POSIX locks on it, and the database can then be corrupted.
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa_event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            _wal(cur)
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
            # SQLAlchemy, not the sqlite3 module, begins transactions (below): the module's own
            # deferred BEGIN cannot be made IMMEDIATE for the writes that must be serialized.
            dbapi_conn.isolation_level = None

        @sa_event.listens_for(engine, "begin")
        def _begin(conn):  # noqa: ANN001
            conn.exec_driver_sql(conn.get_execution_options().get("sqlite_begin", "BEGIN"))

        return engine
    from eft.service.settings import get_settings

    settings = get_settings()
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow, pool_recycle=settings.db_pool_recycle_s,
    )


def is_disconnect(exc: BaseException) -> bool:
    """Whether `exc` means the connection was lost (worth retrying on a new one)."""
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def retrying(fn: Callable[..., T]) -> Callable[..., T]:
    """Call `fn` again, up to `RETRY_ATTEMPTS` times, when its connection drops under it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        for attempt in range(1, RETRY_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except sa.exc.DBAPIError as exc:
                if not is_disconnect(exc) or attempt == RETRY_ATTEMPTS:
                    raise
                log.warning("database connection lost in %s; retrying (%d/%d)",
                            getattr(fn, "__qualname__", fn), attempt, RETRY_ATTEMPTS)
                time.sleep(RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    return wrapper


def once(fn: Callable[..., T]) -> Callable[..., T]:
    """Mark a method that must not be retried on a lost connection: an insert or an increment
    whose commit may have landed before the connection dropped (a retry would write it twice).
    Its caller hears the error and decides."""
    fn.__eft_once__ = True  # type: ignore[attr-defined]
    return fn


def retry_on_disconnect(cls: type) -> type:
    """Class decorator: every public method of `cls` retries on a lost connection, except those
    marked `once` (not safe to repeat)."""
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_") and not getattr(member, "__eft_once__", False):
            setattr(cls, name, retrying(member))
    return cls


_writer_locks: weakref.WeakKeyDictionary[sa.Engine, threading.RLock] = weakref.WeakKeyDictionary()
_writer_locks_guard = threading.Lock()


@contextlib.contextmanager
def writing(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A write transaction.

    On SQLite the writers of this process queue on a lock, and each begins as the database's
    writer (BEGIN IMMEDIATE). SQLite has one writer at a time, and a connection that finds the
    write lock taken sleeps in steps that grow to 100 ms before it looks again: with many
    request threads writing at once, those sleeps were the tail of every create. Writers in
    other processes (job drivers) still wait SQLite's way; they write a few times a second."""
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            yield conn
        return
    with _writer_locks_guard:
        lock = _writer_locks.setdefault(engine, threading.RLock())
    with lock, engine.connect() as conn:
        conn.execution_options(sqlite_begin="BEGIN IMMEDIATE")
        with conn.begin():
            yield conn


@contextlib.contextmanager
def serialized(engine: sa.Engine, key: str) -> Iterator[sa.Connection]:
    """A write transaction that runs alone among all those taking the same `key`, in every
    process sharing the database: PostgreSQL takes a transaction-scoped advisory lock on the
    key; SQLite has one writer at a time and this transaction starts as the writer (BEGIN
    IMMEDIATE), so what it reads cannot change before it commits."""
    with writing(engine) as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(key))))
        yield conn


def tenant_key(tenant: str) -> str:
    """The `serialized` key of a tenant's creates and deletes (quotas, files in use)."""
    return f"eft:tenant:{tenant}"
