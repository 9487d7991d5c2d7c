"""API keys and tenants: who is calling, and which tenant's jobs and files they may see.

Keys look like `eft-<43 url-safe characters>` and are stored only as SHA-256 digests (a key has
256 random bits, so a fast digest is as safe as a slow one and costs nothing per request).
Each key belongs to one tenant and has a role: `user` sees its tenant's objects only (others'
ids answer 404), `admin` sees every tenant's. `EFT_ADMIN_API_KEY` adds a bootstrap admin key that
is never stored, for a deployment's first `eft keys create`.

Manage keys on a machine that reaches the store: `eft keys create --tenant team-a`,
`eft keys list`, `eft keys revoke key_...`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import sqlalchemy as sa

from eft.service.errors import ServiceError
from eft.service.store.schema import api_keys
from eft.service.store.db import writing
from eft.service.store.store import _aware, utcnow

Role = Literal["user", "admin"]
KEY_PREFIX = "eft-"


class Unauthenticated(ServiceError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class KeyNotFound(ServiceError):
    status_code = 404
    code = "key_not_found"


@dataclass(frozen=True)
class Principal:
    """The caller: its tenant (owner of what it creates) and role."""

    tenant: str
    role: Role
    key_id: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def scope(self) -> str | None:
        """The tenant whose objects this caller may see; None means every tenant."""
        return None if self.is_admin else self.tenant


@dataclass(frozen=True)
class ApiKey:
    id: str
    tenant: str
    role: str
    name: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _record(row: sa.Row) -> ApiKey:
    return ApiKey(id=row.id, tenant=row.tenant, role=row.role, name=row.name, prefix=row.prefix,
                  created_at=_aware(row.created_at), revoked_at=_aware(row.revoked_at))


class KeyStore:
    """API keys in the job store's database."""

    def __init__(self, engine: sa.Engine, bootstrap_admin_key: str | None = None,
                 bootstrap_tenant: str = "default"):
        self.engine = engine
        self._bootstrap = bootstrap_admin_key
        self._bootstrap_tenant = bootstrap_tenant

    def create(self, tenant: str, role: Role = "user", name: str | None = None) -> tuple[ApiKey, str]:
        """Create a key. Returns (record, the key in clear: shown once, never stored)."""
        if role not in ("user", "admin"):
            raise ServiceError(f"role must be user or admin, not {role!r}", param="role")
        if not tenant or len(tenant) > 128:
            raise ServiceError("tenant must be 1 to 128 characters", param="tenant")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = f"key_{secrets.token_hex(8)}"
        with writing(self.engine) as conn:
            conn.execute(api_keys.insert().values(
                id=key_id, tenant=tenant, role=role, name=name, key_hash=digest(secret),
                prefix=secret[:10], created_at=utcnow(),
            ))
        return self.get(key_id), secret

    def get(self, key_id: str) -> ApiKey:
        with self.engine.connect() as conn:
            row = conn.execute(api_keys.select().where(api_keys.c.id == key_id)).first()
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id!r}: see `eft keys list`", param="key_id")
        return _record(row)

    def list(self, tenant: str | None = None, include_revoked: bool = False) -> list[ApiKey]:
        query = api_keys.select().order_by(api_keys.c.created_at)
        if tenant is not None:
            query = query.where(api_keys.c.tenant == tenant)
        if not include_revoked:
            query = query.where(api_keys.c.revoked_at.is_(None))
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query).all()]

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key at once; raises KeyNotFound."""
        self.get(key_id)
        with writing(self.engine) as conn:
            conn.execute(api_keys.update().where(api_keys.c.id == key_id,
                                                 api_keys.c.revoked_at.is_(None))
                         .values(revoked_at=utcnow()))
        return self.get(key_id)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller for an `Authorization: Bearer <key>` header; raises Unauthenticated."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(
                "missing API key: send `Authorization: Bearer <key>` (`eft up` writes one to "
                "~/.eft/config.json; an admin creates more with `eft keys create`)",
                param="authorization", code="missing_api_key")
        if self._bootstrap and hmac.compare_digest(token.encode(), self._bootstrap.encode()):
            return Principal(self._bootstrap_tenant, "admin", "bootstrap")
        with self.engine.connect() as conn:
            row = conn.execute(api_keys.select().where(api_keys.c.key_hash == digest(token))).first()
        if row is None or row.revoked_at is not None:
            raise Unauthenticated("invalid or revoked API key: check the key, or ask an admin "
                                  "for a new one (`eft keys create`)", param="authorization")
        return Principal(row.tenant, row.role, row.id)
