"""The cluster scheduler's decision on each job (its target size, the reason, the job that took
its room); the job's estimate before it runs (duration, worker hours, cost) and the worker time
it has used, spot and on-demand apart.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("schedule", sa.JSON))
    op.add_column("jobs", sa.Column("estimate", sa.JSON))
    op.add_column("jobs", sa.Column("worker_seconds", sa.Float, nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("spot_worker_seconds", sa.Float, nullable=False, server_default="0"))


def downgrade() -> None:
    for column in ("spot_worker_seconds", "worker_seconds", "estimate", "schedule"):
        op.drop_column("jobs", column)
