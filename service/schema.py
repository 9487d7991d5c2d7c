"""Tables of accounts, uploads and request replay, on the job store's metadata.

`service/store.py` imports this module, so `Store(url)` creates these tables with the job tables:
- `tenants`: per-tenant quotas (null: the server's default from settings).
- `api_keys`: keys stored as SHA-256 digests; each belongs to one tenant and has a role.
- `files`: uploaded datasets, stored under `EFT_FILES_ROOT` as `<id>.jsonl`.
- `idempotency_keys`: one row per (tenant, Idempotency-Key): the request's digest and what it made.
"""

from __future__ import annotations

import sqlalchemy as sa

from eft.service.store import metadata

tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("max_active_jobs", sa.Integer),
    sa.Column("max_cpus", sa.Float),
    sa.Column("max_gpus", sa.Float),
    sa.Column("queue_over_quota", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False, index=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("name", sa.String(200)),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("prefix", sa.String(16), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True)),
)

files = sa.Table(
    "files",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False, index=True),
    sa.Column("filename", sa.String(255), nullable=False),
    sa.Column("purpose", sa.String(32), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("tenant", sa.String(128), primary_key=True),
    sa.Column("key", sa.String(256), primary_key=True),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("request_hash", sa.String(64), nullable=False),
    # Null while the first request is still creating its resource.
    sa.Column("resource_id", sa.String(64)),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
