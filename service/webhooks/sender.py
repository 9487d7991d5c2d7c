"""Sending webhooks (service/webhooks/rules.py says what, when and to where): each replica's sender
claims the deliveries that are due, checks the receiver's address again, connects to the address
it checked under one deadline per attempt, records every attempt and schedules the next."""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from eft.service.store.db import aware, utcnow, writing
from eft.service.store.schema import webhook_attempts, webhook_deliveries

from eft.service.webhooks.rules import (CLAIM_S, Address, body_bytes, check_url, tenant_secret,
                                  signature)

log = logging.getLogger("eft.webhooks")

#: What an attempt records when it could not reach the receiver: the same words whatever the
#: reason (refused, reset, silent, bad TLS), so that the record tells nothing of the receiver's
#: network. The operator's log has the detail.
UNREACHABLE = "not delivered: no answer from the receiver within the deadline"


class _Deadline:
    """One attempt's deadline: each socket operation waits at most what is left of it, and a
    timer shuts the attempt's socket down when it passes, so that no receiver (a slow TLS
    handshake, headers dripped a byte at a time) holds an attempt longer."""

    def __init__(self, seconds: float):
        self.at = time.monotonic() + seconds
        self.sockets: list[socket.socket] = []
        self.timer = threading.Timer(seconds, self.expire)
        self.timer.daemon = True
        self.timer.start()

    def left(self, timeout: float | None) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            import httpcore

            raise httpcore.TimeoutException("the attempt's deadline passed")
        return left if timeout is None else min(timeout, left)

    def expire(self) -> None:
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self.timer.cancel()


def _pinned_backend(address: Address, deadline: _Deadline) -> Any:
    """An httpcore network backend that connects to `address` whatever host the URL names (the
    URL's host still goes in the Host header and TLS's server name, and the certificate is
    checked against it), under `deadline`."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: Any):
            self.inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.inner.read(max_bytes, deadline.left(timeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, deadline.left(timeout))

        def close(self) -> None:
            self.inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
            return Stream(self.inner.start_tls(ssl_context, server_hostname, deadline.left(timeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.SyncBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            stream = super().connect_tcp(str(address), port, deadline.left(timeout), local_address, socket_options)
            deadline.sockets.append(stream.get_extra_info("socket"))
            return Stream(stream)

    return Backend()


class WebhookSender:
    """Sends what is due, in a thread of each replica (`run_forever`), or one pass at a time
    (`send_due`, with the time given: tests step the clock instead of waiting).

    Attempts run on `EFT_WEBHOOK_CONCURRENCY` threads, at most `EFT_WEBHOOK_TENANT_CONCURRENCY`
    of them for one tenant, and what is due is taken in turns: each tenant's oldest first, and
    within a tenant each endpoint's oldest first. Every attempt has one deadline in all
    (`EFT_WEBHOOK_TIMEOUT_S`), reads the answer's status and headers only, and goes to the
    address its URL resolved to when checked just before it."""

    def __init__(self, engine: sa.Engine, settings: Any):
        import httpx

        self.engine, self.settings = engine, settings
        self.ssl_context = httpx.create_ssl_context()
        self.pool = ThreadPoolExecutor(max_workers=settings.webhook_concurrency, thread_name_prefix="eft-webhook")
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}  # tenant -> attempts in flight
        self._stop, self._wake = threading.Event(), threading.Event()
        self.last_pass = time.monotonic()

    def close(self) -> None:
        self.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def backoff(self, attempts: int) -> float:
        """Seconds before the next attempt after `attempts` failed ones."""
        return min(self.settings.webhook_retry_base_s * 2 ** (attempts - 1), self.settings.webhook_retry_max_s)

    def _due(self, now: datetime, limit: int) -> list[Any]:
        """Up to `limit` deliveries due at `now`, in turns: every tenant's first before any
        tenant's second, and within a tenant every endpoint's first before any second; no
        tenant beyond its free attempt slots."""
        d = webhook_deliveries
        by_url = sa.func.row_number().over(partition_by=(d.c.tenant, d.c.url), order_by=(d.c.next_attempt_at, d.c.id))
        inner = sa.select(d, by_url.label("url_turn")).where(d.c.status == "pending", d.c.next_attempt_at <= now).subquery()
        turn = sa.func.row_number().over(partition_by=inner.c.tenant,
                                         order_by=(inner.c.url_turn, inner.c.next_attempt_at, inner.c.id))
        ranked = sa.select(inner, turn.label("turn")).subquery()
        query = (sa.select(*(ranked.c[c.name] for c in d.columns))
                 .where(ranked.c.turn <= self.settings.webhook_tenant_concurrency)
                 .order_by(ranked.c.turn, ranked.c.next_attempt_at, ranked.c.id).limit(limit * 4))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        chosen = []
        with self._lock:
            taken: dict[str, int] = {}
            for row in rows:
                held = self._busy.get(row.tenant, 0) + taken.get(row.tenant, 0)
                if held < self.settings.webhook_tenant_concurrency and len(chosen) < limit:
                    taken[row.tenant] = taken.get(row.tenant, 0) + 1
                    chosen.append(row)
        return chosen

    def _start(self, now: datetime, limit: int) -> list[Any]:
        """Claim what is due and start its attempts; returns their futures."""
        with self._lock:
            free = self.settings.webhook_concurrency - sum(self._busy.values())
        futures = []
        for row in self._due(now, min(limit, free)) if free > 0 else ():
            if not self._claim(row, now):
                continue
            with self._lock:
                self._busy[row.tenant] = self._busy.get(row.tenant, 0) + 1
            future = self.pool.submit(self._attempt, row, now)
            future.add_done_callback(lambda _, tenant=row.tenant: self._done(tenant))
            futures.append(future)
        return futures

    def _done(self, tenant: str) -> None:
        with self._lock:
            self._busy[tenant] -= 1
            if not self._busy[tenant]:
                del self._busy[tenant]
        self._wake.set()

    def send_due(self, now: datetime | None = None, limit: int = 50) -> int:
        """Send the deliveries due at `now` (default: the present), in turns, and wait for the
        attempts. Returns how many were made."""
        futures = self._start(now or utcnow(), limit)
        for future in futures:
            future.result()
        return len(futures)

    def _claim(self, row: Any, now: datetime) -> bool:
        with writing(self.engine) as conn:
            result = conn.execute(webhook_deliveries.update().where(
                webhook_deliveries.c.id == row.id, webhook_deliveries.c.status == "pending",
                webhook_deliveries.c.attempts == row.attempts, webhook_deliveries.c.next_attempt_at <= now,
            ).values(next_attempt_at=now + timedelta(seconds=CLAIM_S)))
        return result.rowcount == 1

    def _secret(self, tenant: str) -> str | None:
        with self.engine.connect() as conn:
            return tenant_secret(conn, tenant)

    def post(self, url: str, address: Address, body: bytes, headers: dict[str, str]) -> int:
        """POST `body` to `url` at `address`, under one deadline; returns the answer's status
        (its body is never read)."""
        import httpcore

        deadline = _Deadline(self.settings.webhook_timeout_s)
        pool = httpcore.ConnectionPool(ssl_context=self.ssl_context, max_connections=1, retries=0,
                                       network_backend=_pinned_backend(address, deadline))
        try:
            seconds = self.settings.webhook_timeout_s
            with pool.stream("POST", url, headers=[(k.encode(), v.encode()) for k, v in headers.items()],
                             content=body, extensions={"timeout": {"connect": seconds, "read": seconds,
                                                                   "write": seconds, "pool": seconds}}) as answer:
                return answer.status
        finally:
            deadline.cancel()
            pool.close()

    def _attempt(self, row: Any, now: datetime) -> None:
        started = time.perf_counter()
        status_code, error = None, None
        settings = self.settings
        address, refused = check_url(row.url, settings.webhook_allow_loopback, settings.webhook_allow_private,
                                     settings.webhook_dns_timeout_s)
        secret = self._secret(row.tenant)
        if refused:
            error = f"refused: the URL {refused}"
        elif secret is None:
            error = "the tenant has no signing secret (POST /webhooks/secret)"
        else:
            body = body_bytes(row.payload)
            timestamp = int(now.timestamp())
            headers = {"Host": urlsplit(row.url).netloc, "Content-Type": "application/json",
                       "Content-Length": str(len(body)),
                       "User-Agent": "eft-webhooks/1", "webhook-id": row.event_id,
                       "webhook-timestamp": str(timestamp),
                       "webhook-signature": signature(secret, row.event_id, timestamp, body)}
            try:
                status_code = self.post(row.url, address, body, headers)
                if not 200 <= status_code < 300:
                    error = f"answered {status_code}"
            except Exception as exc:  # noqa: BLE001 - any failure to deliver is retried
                error = UNREACHABLE
                log.info("webhook %s to %s (%s): %s: %s", row.event_id, row.url, address, type(exc).__name__, exc)
        attempts = row.attempts + 1
        created = aware(row.created_at)
        values: dict[str, Any]
        if error is None:
            values = {"status": "delivered", "delivered_at": now, "next_attempt_at": now}
        elif refused or (now - created).total_seconds() + self.backoff(attempts) > settings.webhook_retry_for_s:
            values = {"status": "failed", "next_attempt_at": now}
        else:
            values = {"status": "pending", "next_attempt_at": now + timedelta(seconds=self.backoff(attempts))}
        with writing(self.engine) as conn:  # a delivery cancelled meanwhile (its endpoint deleted) stays so
            conn.execute(webhook_deliveries.update().where(webhook_deliveries.c.id == row.id,
                                                           webhook_deliveries.c.status == "pending")
                         .values(attempts=attempts, **values))
            conn.execute(webhook_attempts.insert().values(
                delivery_id=row.id, attempt=attempts, at=now, status_code=status_code, error=error,
                seconds=time.perf_counter() - started))
        if error:
            log.info("webhook %s to %s, attempt %s: %s", row.event_id, row.url, attempts, error)

    def healthy(self) -> bool:
        """Whether the sending loop is turning (a pass started within five minutes: a slow
        database must not get the replica, and its scheduler, restarted)."""
        return time.monotonic() - self.last_pass < max(300.0, 10 * self.settings.webhook_poll_interval_s)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            self.last_pass = time.monotonic()
            self._wake.clear()
            try:
                self._start(utcnow(), 50)
            except Exception:  # noqa: BLE001 - one bad pass must not stop the sender
                log.exception("webhook pass failed")
            self._wake.wait(self.settings.webhook_poll_interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
