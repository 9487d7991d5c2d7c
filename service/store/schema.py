"""The job store's tables, on one metadata (the migrations in service/store/migrations/ build exactly
these; tests/integration/test_migrations.py checks):
- `jobs`, `job_events`, `job_metrics`, `checkpoints`: each job, its timeline, its step metrics
  and the checkpoints it saved.
- `tenants`: per-tenant quotas (null: the server's default from settings).
- `api_keys`: keys stored as SHA-256 digests; each belongs to one tenant and has a role.
- `files`: uploaded datasets, stored under `EFT_FILES_ROOT` as `<id>.jsonl`.
- `idempotency_keys`: one row per (tenant, Idempotency-Key): the request's digest and what it made.
- `webhook_secrets`, `webhook_endpoints`: each tenant's signing secret and its webhook URLs.
- `webhook_deliveries`, `webhook_attempts`: each event owed to a URL (an outbox written in the
  transaction that changed the job) and every attempt to deliver it.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

metadata = sa.MetaData()

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False, index=True),
    sa.Column("name", sa.String(200)),
    sa.Column("status", sa.String(32), nullable=False, index=True),
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("config", sa.JSON),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("num_workers", sa.Integer),
    sa.Column("submission_id", sa.String(128)),
    sa.Column("step", sa.Integer, nullable=False, default=0),
    sa.Column("total_steps", sa.Integer),
    sa.Column("error_code", sa.String(128)),
    sa.Column("error_message", sa.Text),
    sa.Column("error_param", sa.String(256)),
    sa.Column("artifact_path", sa.Text),
    sa.Column("result_metrics", sa.JSON),
    # Recovery counters: worker-group restarts after failures, node preemptions, elastic
    # resizes, and optimizer steps trained twice because they came after the last checkpoint.
    sa.Column("restarts", sa.Integer, nullable=False, default=0),
    sa.Column("preemptions", sa.Integer, nullable=False, default=0),
    sa.Column("resizes", sa.Integer, nullable=False, default=0),
    sa.Column("lost_steps", sa.Integer, nullable=False, default=0),
    #: CPUs and GPUs the job asks for at its largest size (quotas sum them in SQL).
    sa.Column("demand_cpus", sa.Float, nullable=False, server_default="0"),
    sa.Column("demand_gpus", sa.Float, nullable=False, server_default="0"),
    #: The planner's choice, made once when the job is accepted (service/requests/plan.py:Choice as a dict).
    sa.Column("plan", sa.JSON),
    #: The cluster scheduler's latest decision for the job (eft.service.scheduling.policy.Decision as a dict:
    #: workers, reason, because_of, placement); a running elastic job's driver keeps its size to
    #: `workers`, and `paused` marks a pause the scheduler made (it resumes it when room frees).
    sa.Column("schedule", sa.JSON),
    #: Before the run: its duration, worker hours and cost as estimated at validation
    #: (eft.service.scheduling.estimates), with the prices it was accepted under.
    sa.Column("estimate", sa.JSON),
    #: Worker time used so far (seconds x workers), all of it and the part on spot nodes.
    sa.Column("worker_seconds", sa.Float, nullable=False, server_default="0"),
    sa.Column("spot_worker_seconds", sa.Float, nullable=False, server_default="0"),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
)

job_events = sa.Table(
    "job_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("level", sa.String(16), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
)

job_metrics = sa.Table(
    "job_metrics",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("values", sa.JSON, nullable=False),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("metrics", sa.JSON, nullable=False),
    sa.Column("world_size", sa.Integer),
    sa.Column("reason", sa.String(32)),
    sa.Column("size_bytes", sa.BigInteger),
    sa.Column("save_seconds", sa.Float),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


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

webhook_secrets = sa.Table(
    "webhook_secrets",
    metadata,
    sa.Column("tenant", sa.String(128), primary_key=True),
    sa.Column("secret", sa.String(128), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

webhook_endpoints = sa.Table(
    "webhook_endpoints",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False, index=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("events", sa.JSON, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("event_id", sa.String(64), nullable=False),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False, index=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("delivered_at", sa.DateTime(timezone=True)),
)

webhook_attempts = sa.Table(
    "webhook_attempts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("delivery_id", sa.Integer, sa.ForeignKey("webhook_deliveries.id"), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("status_code", sa.Integer),
    sa.Column("error", sa.Text),
    sa.Column("seconds", sa.Float, nullable=False),
)
