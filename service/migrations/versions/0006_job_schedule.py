"""The cluster scheduler's decision on each job (its target size, the reason, the job that took
its room).

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


def downgrade() -> None:
    op.drop_column("jobs", "schedule")
