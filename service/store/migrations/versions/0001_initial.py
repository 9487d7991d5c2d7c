"""The job store as first released: jobs, their events, metrics and checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _job_fk() -> sa.Column:
    return sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200)),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("num_workers", sa.Integer),
        sa.Column("submission_id", sa.String(128)),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("total_steps", sa.Integer),
        sa.Column("error_code", sa.String(128)),
        sa.Column("error_message", sa.Text),
        sa.Column("error_param", sa.String(256)),
        sa.Column("artifact_path", sa.Text),
        sa.Column("result_metrics", sa.JSON),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
        sa.Column("resizes", sa.Integer, nullable=False),
        sa.Column("lost_steps", sa.Integer, nullable=False),
        sa.Column("idempotency_key", sa.String(256)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency"),
    )
    op.create_index("ix_jobs_tenant", "jobs", ["tenant"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _job_fk(),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "job_metrics",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _job_fk(),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("values", sa.JSON, nullable=False),
    )
    op.create_index("ix_job_metrics_job_id", "job_metrics", ["job_id"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _job_fk(),
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
    op.create_index("ix_checkpoints_job_id", "checkpoints", ["job_id"])


def downgrade() -> None:
    for table in ("checkpoints", "job_metrics", "job_events", "jobs"):
        op.drop_table(table)
