"""`Idempotency-Key` on creates: a repeat with the same key and body returns what the first
request made; the same key with another body (or on another endpoint) is a 409.

The first request claims the key by inserting its row (the primary key makes concurrent claims
race in the database, on SQLite and PostgreSQL alike), creates the resource, then records its id.
A concurrent repeat waits for that id, so retries racing each other make one job, not two. A
claim whose request failed is released, so a corrected retry with the same key can succeed.
While its request runs, the claim's time is renewed every HEARTBEAT_S: only a claim nobody has
renewed for ABANDONED_AFTER_S (its request died half-way) is taken over, never one whose request
is merely slow.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from eft.service.errors import Conflict
from eft.service.store.schema import idempotency_keys as table
from eft.service.store.db import writing
from eft.service.store.store import _aware, utcnow

#: A claim not renewed for this long, with no resource, is from a request that died half-way.
ABANDONED_AFTER_S = 60.0
#: How often a running request renews its claim.
HEARTBEAT_S = 5.0


def request_digest(body: Any) -> str:
    """SHA-256 of the body as canonical JSON (key order and spacing do not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class Idempotency:
    """Replay of creates, keyed by (tenant, Idempotency-Key)."""

    def __init__(self, engine: sa.Engine, wait_s: float = 30.0, poll_s: float = 0.05):
        self.engine, self.wait_s, self.poll_s = engine, wait_s, poll_s

    def run(self, tenant: str, key: str | None, endpoint: str, digest: str,
            create: Callable[[], str]) -> tuple[str, bool]:
        """Create once per key. Returns (resource id, created now).

        Raises Conflict when the key was used with another body or endpoint, or while the first
        request is still running after `wait_s`; whatever `create` raises passes through.
        """
        if not key:
            return create(), True
        deadline = time.monotonic() + self.wait_s
        while True:
            row = self._row(tenant, key)
            if row is None:
                if self._claim(tenant, key, endpoint, digest):
                    return self._create_claimed(tenant, key, create), True
                continue
            if row.endpoint != endpoint or row.request_hash != digest:
                raise Conflict(
                    f"Idempotency-Key {key!r} was already used with a different request"
                    f"{'' if row.endpoint == endpoint else ' on ' + row.endpoint}: send a new key "
                    "for a new request, or repeat the first request unchanged",
                    param="Idempotency-Key", code="idempotency_key_reused")
            if row.resource_id:
                return row.resource_id, False
            if utcnow() - _aware(row.created_at) > timedelta(seconds=ABANDONED_AFTER_S):
                self._release(tenant, key)
                continue
            if time.monotonic() > deadline:
                raise Conflict("a request with this Idempotency-Key is still being processed: "
                               "retry shortly", param="Idempotency-Key", code="idempotency_in_progress")
            time.sleep(self.poll_s)

    def _row(self, tenant: str, key: str) -> sa.Row | None:
        with self.engine.connect() as conn:
            return conn.execute(table.select().where(table.c.tenant == tenant,
                                                     table.c.key == key)).first()

    def _claim(self, tenant: str, key: str, endpoint: str, digest: str) -> bool:
        try:
            with writing(self.engine) as conn:
                conn.execute(table.insert().values(tenant=tenant, key=key, endpoint=endpoint,
                                                   request_hash=digest, created_at=utcnow()))
        except sa.exc.IntegrityError:
            return False
        return True

    def _create_claimed(self, tenant: str, key: str, create: Callable[[], str]) -> str:
        done = threading.Event()
        heartbeat = threading.Thread(target=self._renew, args=(tenant, key, done), daemon=True)
        heartbeat.start()
        try:
            resource_id = create()
        except BaseException:
            self._release(tenant, key)
            raise
        finally:
            done.set()
            heartbeat.join()
        with writing(self.engine) as conn:
            conn.execute(table.update().where(table.c.tenant == tenant, table.c.key == key)
                         .values(resource_id=resource_id))
        return resource_id

    def _renew(self, tenant: str, key: str, done: threading.Event) -> None:
        """Keep the claim fresh until `done`: a repeat never mistakes a slow request for a dead one."""
        while not done.wait(HEARTBEAT_S):
            try:
                with writing(self.engine) as conn:
                    conn.execute(table.update().where(table.c.tenant == tenant, table.c.key == key,
                                                      table.c.resource_id.is_(None)).values(created_at=utcnow()))
            except sa.exc.SQLAlchemyError:
                continue  # the next beat tries again; a claim lapses only after many misses

    def _release(self, tenant: str, key: str) -> None:
        with writing(self.engine) as conn:
            conn.execute(table.delete().where(table.c.tenant == tenant, table.c.key == key,
                                              table.c.resource_id.is_(None)))
