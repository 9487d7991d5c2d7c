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
  never a host that resolves to a private, loopback, link-local or reserved address unless
  the operator allows it (`EFT_WEBHOOK_ALLOW_PRIVATE`), checked when the URL is given and again
  before every attempt (its DNS may change); redirects are not followed.
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
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from eft.service.db import aware, utcnow, writing
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


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def url_problem(url: str, allow_loopback: bool, allow_private: bool) -> str | None:
    """Why a webhook may not go to `url`, or None. Resolves the host."""
    try:
        parts = urlsplit(url)
        hostname, _ = parts.hostname, parts.port  # both parse the authority, and raise on a bad one
    except ValueError:
        return "must be an absolute https:// URL with a valid host and port"
    if parts.scheme not in ("https", "http") or not hostname:
        return "must be an absolute https:// URL"
    if parts.username or parts.password:
        return "must not carry credentials: authenticate the sender by the signature instead"
    try:
        addresses = _addresses(parts.hostname)
    except (OSError, UnicodeError) as exc:
        return f"its host {parts.hostname!r} does not resolve ({exc})"
    loopback = bool(addresses) and all(a.is_loopback for a in addresses)
    if parts.scheme == "http" and not (loopback and allow_loopback):
        return ("must be https (plain http only to a loopback address in local mode, "
                "EFT_WEBHOOK_ALLOW_LOOPBACK)")
    if loopback and allow_loopback:
        return None
    if not allow_private:
        for address in addresses:
            if (address.is_private or address.is_loopback or address.is_link_local or address.is_reserved
                    or address.is_multicast or address.is_unspecified):
                return (f"its host resolves to {address}, a private or reserved address, where this "
                        "server sends no webhooks (the operator may allow it: EFT_WEBHOOK_ALLOW_PRIVATE)")
    return None


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


def create_endpoint(engine: sa.Engine, tenant: str, url: str, events: list[str]) -> dict[str, Any]:
    row = {"id": "whep_" + secrets.token_hex(10), "tenant": tenant, "url": url, "events": list(events),
           "created_at": utcnow()}
    with writing(engine) as conn:
        conn.execute(webhook_endpoints.insert().values(**row))
    return row


def list_endpoints(engine: sa.Engine, tenant: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(webhook_endpoints.select().where(webhook_endpoints.c.tenant == tenant)
                            .order_by(webhook_endpoints.c.created_at)).all()
    return [{**r._mapping, "created_at": aware(r.created_at)} for r in rows]


def delete_endpoint(engine: sa.Engine, tenant: str, endpoint_id: str) -> bool:
    with writing(engine) as conn:
        result = conn.execute(webhook_endpoints.delete().where(webhook_endpoints.c.id == endpoint_id,
                                                               webhook_endpoints.c.tenant == tenant))
    return result.rowcount == 1


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


class WebhookSender:
    """Sends what is due, in a thread of each replica (`run_forever`), or one pass at a time
    (`send_due`, with the time given: tests step the clock instead of waiting)."""

    def __init__(self, engine: sa.Engine, settings: Any, client: Any = None):
        import httpx

        self.engine, self.settings = engine, settings
        self.client = client or httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False,
                                             headers={"User-Agent": "eft-webhooks/1"})
        self._stop = threading.Event()

    def backoff(self, attempts: int) -> float:
        """Seconds before the next attempt after `attempts` failed ones."""
        return min(self.settings.webhook_retry_base_s * 2 ** (attempts - 1), self.settings.webhook_retry_max_s)

    def send_due(self, now: datetime | None = None, limit: int = 50) -> int:
        """Send every delivery due at `now` (default: the present). Returns attempts made."""
        now = now or utcnow()
        with self.engine.connect() as conn:
            due = conn.execute(webhook_deliveries.select().where(
                webhook_deliveries.c.status == "pending", webhook_deliveries.c.next_attempt_at <= now)
                .order_by(webhook_deliveries.c.next_attempt_at).limit(limit)).all()
        made = 0
        for row in due:
            if self._claim(row, now):
                self._attempt(row, now)
                made += 1
        return made

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

    def _attempt(self, row: Any, now: datetime) -> None:
        started = time.perf_counter()
        status_code, error = None, None
        refused = url_problem(row.url, self.settings.webhook_allow_loopback, self.settings.webhook_allow_private)
        secret = self._secret(row.tenant)
        if refused:
            error = f"refused: the URL {refused}"
        elif secret is None:
            error = "the tenant has no signing secret (POST /webhooks/secret)"
        else:
            body = body_bytes(row.payload)
            timestamp = int(now.timestamp())
            headers = {"Content-Type": "application/json", "webhook-id": row.event_id,
                       "webhook-timestamp": str(timestamp),
                       "webhook-signature": signature(secret, row.event_id, timestamp, body)}
            try:
                response = self.client.post(row.url, content=body, headers=headers)
                status_code = response.status_code
                if not 200 <= status_code < 300:
                    error = f"answered {status_code}"
            except Exception as exc:  # noqa: BLE001 - any failure to deliver is retried
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
        attempts = row.attempts + 1
        created = aware(row.created_at)
        values: dict[str, Any]
        if error is None:
            values = {"status": "delivered", "delivered_at": now, "next_attempt_at": now}
        elif refused or (now - created).total_seconds() + self.backoff(attempts) > self.settings.webhook_retry_for_s:
            values = {"status": "failed", "next_attempt_at": now}
        else:
            values = {"status": "pending", "next_attempt_at": now + timedelta(seconds=self.backoff(attempts))}
        with writing(self.engine) as conn:
            conn.execute(webhook_deliveries.update().where(webhook_deliveries.c.id == row.id)
                         .values(attempts=attempts, **values))
            conn.execute(webhook_attempts.insert().values(
                delivery_id=row.id, attempt=attempts, at=now, status_code=status_code, error=error,
                seconds=time.perf_counter() - started))
        if error:
            log.info("webhook %s to %s, attempt %s: %s", row.event_id, row.url, attempts, error)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                while self.send_due():
                    pass
            except Exception:  # noqa: BLE001 - one bad pass must not stop the sender
                log.exception("webhook pass failed")
            self._stop.wait(self.settings.webhook_poll_interval_s)

    def stop(self) -> None:
        self._stop.set()
