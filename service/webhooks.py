"""Webhooks: a job's terminal and paused changes, pushed to URLs its tenant chose, signed.

- Where: a job's own `webhook_url`, and the tenant's endpoints (`POST /webhooks`), each for the
  event types it names.
- What: OpenAI's webhook events (body `{"object": "event", "id", "type", "created_at", "data":
  {"id": <job id>}}`, types `fine_tuning.job.succeeded|failed|cancelled|paused`) with the
  Standard Webhooks headers OpenAI sends: `webhook-id` (the event's id, the same on every
  retry), `webhook-timestamp` (Unix seconds of the attempt) and `webhook-signature`
  (`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` under the tenant's secret
  `whsec_<base64 key>`, shown once when made). OpenAI's SDK verifies them
  (`client.webhooks.verify_signature(body, headers, secret=...)`).
- When: the delivery is written in the same transaction as the job's change (an outbox), so
  none is lost; each replica's sender sends what is due, retrying a failed attempt after
  `EFT_WEBHOOK_RETRY_BASE_S`, doubling up to `EFT_WEBHOOK_RETRY_MAX_S`, for a day
  (`EFT_WEBHOOK_RETRY_FOR_S`): at least once. A claim (compare-and-set on the attempt count)
  keeps two replicas from sending the same attempt. Every attempt is recorded
  (`GET /jobs/{id}/webhooks`).
- To where not: https only (plain-http loopback in local mode, `EFT_WEBHOOK_ALLOW_LOOPBACK`);
  only to public internet addresses unless the operator allows others
  (`EFT_WEBHOOK_ALLOW_PRIVATE`), checked when the URL is given and again before every attempt
  (its DNS may change), which then connects to the address it checked; redirects are not
  followed.
- Bounded: one deadline per attempt in all, the answer's body never read, host names resolved
  off the caller's thread under their own timeout, a cap on endpoints per tenant, tenants and
  endpoints taking turns for a few attempt threads (see WebhookSender).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from eft.service.db import aware, serialized, tenant_key, utcnow, writing
from eft.service.schema import webhook_attempts, webhook_deliveries, webhook_endpoints, webhook_secrets
from eft.types.jobs import JobStatus

log = logging.getLogger("eft.webhooks")

#: The job status -> the event type a webhook carries (OpenAI's names).
EVENTS = {
    JobStatus.succeeded: "fine_tuning.job.succeeded",
    JobStatus.failed: "fine_tuning.job.failed",
    JobStatus.cancelled: "fine_tuning.job.cancelled",
    JobStatus.paused: "fine_tuning.job.paused",
}
EVENT_TYPES = tuple(EVENTS.values())
SECRET_PREFIX = "whsec_"
#: How long a claimed attempt is held before another replica may take it over.
CLAIM_S = 120.0


# --- signing ---------------------------------------------------------------------------------


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value (Standard Webhooks, version 1)."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def body_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


# --- where a webhook may go ------------------------------------------------------------------

#: Host names resolve here, never on the thread that asked (an API thread, the sender), each
#: under its own timeout: a name whose DNS answers slowly holds one of these threads, at most.
_RESOLVER = ThreadPoolExecutor(max_workers=8, thread_name_prefix="eft-webhook-dns")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Unresolved(Exception):
    """The host did not resolve (or not within the timeout)."""


def _addresses(host: str, timeout: float) -> list[Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    future = _RESOLVER.submit(socket.getaddrinfo, host, None, proto=socket.IPPROTO_TCP)
    try:
        infos = future.result(timeout=timeout)
    except FutureTimeout:
        future.cancel()
        raise Unresolved(f"did not resolve within {timeout:g} s") from None
    except (OSError, UnicodeError) as exc:
        raise Unresolved("does not resolve") from exc
    found = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not found:
        raise Unresolved("does not resolve")
    return found


def public(address: Address) -> bool:
    """Whether `address` is on the public internet, and so is any IPv4 address it carries
    (IPv4-mapped, 6to4, Teredo, NAT64: each a way back to a private or loopback one)."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
        if address in NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return all(public(e) for e in embedded if e is not None)
    return True


NAT64 = ipaddress.ip_network("64:ff9b::/96")


def check_url(url: str, allow_loopback: bool, allow_private: bool,
              dns_timeout: float) -> tuple[Address | None, str | None]:
    """Resolve `url`'s host once: (the address to send to, None) or (None, why not). A webhook
    is sent to the address checked here, never to a second resolution of the name."""
    try:
        parts = urlsplit(url)
        hostname, _ = parts.hostname, parts.port  # both parse the authority, and raise on a bad one
    except ValueError:
        return None, "must be an absolute https:// URL with a valid host and port"
    if parts.scheme not in ("https", "http") or not hostname:
        return None, "must be an absolute https:// URL"
    if parts.username or parts.password:
        return None, "must not carry credentials: authenticate the sender by the signature instead"
    try:
        addresses = _addresses(hostname, dns_timeout)
    except Unresolved as exc:
        return None, f"has a host {hostname!r} that {exc}"
    loopback = all(a.is_loopback for a in addresses)
    if parts.scheme == "http" and not (loopback and allow_loopback):
        return None, ("must be https (plain http only to a loopback address in local mode, "
                      "EFT_WEBHOOK_ALLOW_LOOPBACK)")
    if loopback and allow_loopback:
        return addresses[0], None
    if allow_private:
        return addresses[0], None
    for address in addresses:
        if not public(address):
            return None, (f"has a host that resolves to {address}, a private, reserved or otherwise "
                          "non-public address, where this server sends no webhooks (the operator may allow it: EFT_WEBHOOK_ALLOW_PRIVATE)")
    return addresses[0], None


def url_problem(url: str, allow_loopback: bool, allow_private: bool, dns_timeout: float = 2.0) -> str | None:
    """Why a webhook may not go to `url`, or None. Resolves the host (under `dns_timeout`)."""
    return check_url(url, allow_loopback, allow_private, dns_timeout)[1]


# --- the tenant's secret and endpoints ----------------------------------------------------------


def tenant_secret(conn: sa.Connection, tenant: str) -> str | None:
    return conn.execute(sa.select(webhook_secrets.c.secret).where(webhook_secrets.c.tenant == tenant)).scalar()


def rotate_secret(engine: sa.Engine, tenant: str) -> str:
    """A new signing secret for the tenant (the old one stops signing at once)."""
    secret = new_secret()
    with writing(engine) as conn:
        conn.execute(webhook_secrets.delete().where(webhook_secrets.c.tenant == tenant))
        conn.execute(webhook_secrets.insert().values(tenant=tenant, secret=secret, created_at=utcnow()))
    return secret


def ensure_secret(engine: sa.Engine, tenant: str) -> str | None:
    """Make the tenant's secret if it has none. Returns it when made now (shown once), else None."""
    with engine.connect() as conn:
        if tenant_secret(conn, tenant) is not None:
            return None
    try:
        with writing(engine) as conn:
            if tenant_secret(conn, tenant) is not None:
                return None
            secret = new_secret()
            conn.execute(webhook_secrets.insert().values(tenant=tenant, secret=secret, created_at=utcnow()))
            return secret
    except sa.exc.IntegrityError:  # another request made it first
        return None


def has_secret(engine: sa.Engine, tenant: str) -> bool:
    with engine.connect() as conn:
        return tenant_secret(conn, tenant) is not None


class TooManyEndpoints(Exception):
    """The tenant has as many endpoints as the server allows."""


def create_endpoint(engine: sa.Engine, tenant: str, url: str, events: list[str], limit: int) -> dict[str, Any]:
    """A new endpoint of the tenant; raises TooManyEndpoints when it has `limit` already
    (counted in the tenant's serialized transaction: two creates at once cannot pass it)."""
    row = {"id": "whep_" + secrets.token_hex(10), "tenant": tenant, "url": url, "events": list(events),
           "created_at": utcnow()}
    with serialized(engine, tenant_key(tenant)) as conn:
        held = conn.execute(sa.select(sa.func.count()).select_from(webhook_endpoints)
                            .where(webhook_endpoints.c.tenant == tenant)).scalar_one()
        if held >= limit:
            raise TooManyEndpoints(held)
        conn.execute(webhook_endpoints.insert().values(**row))
    return row


def list_endpoints(engine: sa.Engine, tenant: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(webhook_endpoints.select().where(webhook_endpoints.c.tenant == tenant)
                            .order_by(webhook_endpoints.c.created_at)).all()
    return [{**r._mapping, "created_at": aware(r.created_at)} for r in rows]


def delete_endpoint(engine: sa.Engine, tenant: str, endpoint_id: str) -> bool:
    """Delete the endpoint, and cancel what is still owed to its URL (unless another endpoint
    of the tenant, or the job's own `webhook_url`, asked for it too)."""
    from eft.service.schema import jobs

    with writing(engine) as conn:
        url = conn.execute(sa.select(webhook_endpoints.c.url).where(
            webhook_endpoints.c.id == endpoint_id, webhook_endpoints.c.tenant == tenant)).scalar()
        if url is None:
            return False
        conn.execute(webhook_endpoints.delete().where(webhook_endpoints.c.id == endpoint_id))
        still = conn.execute(sa.select(webhook_endpoints.c.id).where(
            webhook_endpoints.c.tenant == tenant, webhook_endpoints.c.url == url).limit(1)).first()
        if still is None:
            owed = conn.execute(sa.select(webhook_deliveries.c.id, jobs.c.request)
                                .join(jobs, jobs.c.id == webhook_deliveries.c.job_id, isouter=True)
                                .where(webhook_deliveries.c.tenant == tenant, webhook_deliveries.c.url == url,
                                       webhook_deliveries.c.status == "pending")).all()
            cancel = [row.id for row in owed if (row.request or {}).get("webhook_url") != url]
            if cancel:
                conn.execute(webhook_deliveries.update().where(webhook_deliveries.c.id.in_(cancel),
                                                               webhook_deliveries.c.status == "pending")
                             .values(status="cancelled"))
    return True


# --- the outbox ------------------------------------------------------------------------------


def enqueue(conn: sa.Connection, job: Any, target: JobStatus, now: datetime) -> int:
    """Within the transaction that moves `job` to `target`: one delivery per URL that asked for
    this event (the job's `webhook_url`, the tenant's endpoints). Returns how many."""
    event = EVENTS.get(target)
    if event is None:
        return 0
    urls = []
    own = (job.request or {}).get("webhook_url")
    if own:
        urls.append(own)
    for url, events in conn.execute(sa.select(webhook_endpoints.c.url, webhook_endpoints.c.events)
                                    .where(webhook_endpoints.c.tenant == job.tenant)).all():
        if event in events and url not in urls:
            urls.append(url)
    if not urls:
        return 0
    event_id = "evt_" + secrets.token_hex(12)
    payload = {"object": "event", "id": event_id, "type": event, "created_at": int(now.timestamp()),
               "data": {"id": job.id}}
    conn.execute(webhook_deliveries.insert(), [
        {"tenant": job.tenant, "job_id": job.id, "event_id": event_id, "event_type": event, "url": url,
         "payload": payload, "status": "pending", "attempts": 0, "next_attempt_at": now, "created_at": now}
        for url in urls])
    return len(urls)


def deliveries_of(engine: sa.Engine, job_id: str) -> list[dict[str, Any]]:
    """The job's deliveries, oldest first, each with its attempts."""
    with engine.connect() as conn:
        rows = conn.execute(webhook_deliveries.select().where(webhook_deliveries.c.job_id == job_id)
                            .order_by(webhook_deliveries.c.id)).all()
        ids = [r.id for r in rows]
        attempts = conn.execute(webhook_attempts.select().where(webhook_attempts.c.delivery_id.in_(ids))
                                .order_by(webhook_attempts.c.id)).all() if ids else []
    by_delivery: dict[int, list[dict[str, Any]]] = {}
    for a in attempts:
        by_delivery.setdefault(a.delivery_id, []).append(
            {"attempt": a.attempt, "at": aware(a.at), "status_code": a.status_code, "error": a.error,
             "seconds": round(a.seconds, 4)})
    return [{"id": r.id, "event_id": r.event_id, "type": r.event_type, "url": r.url, "status": r.status,
             "attempts": by_delivery.get(r.id, []), "created_at": aware(r.created_at),
             "delivered_at": aware(r.delivered_at),
             "next_attempt_at": aware(r.next_attempt_at) if r.status == "pending" else None}
            for r in rows]


# --- sending ---------------------------------------------------------------------------------

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
