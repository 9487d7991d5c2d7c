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
  endpoints taking turns for a few attempt threads (service/webhooks/sender.py).
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
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from eft.service.store.db import aware, serialized, tenant_key, utcnow, writing
from eft.service.store.schema import webhook_attempts, webhook_deliveries, webhook_endpoints, webhook_secrets
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
    from eft.service.store.schema import jobs

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
