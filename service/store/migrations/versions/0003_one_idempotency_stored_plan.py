"""One idempotency mechanism and the plan stored once: `jobs.idempotency_key` goes (the
`idempotency_keys` table answers repeated creates), `jobs.plan` keeps the planner's choice made
when the job was accepted, so the scheduler does not plan it again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("plan", sa.JSON))
        batch.drop_constraint("uq_jobs_tenant_idempotency", type_="unique")
        batch.drop_column("idempotency_key")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(256)))
        batch.create_unique_constraint("uq_jobs_tenant_idempotency", ["tenant", "idempotency_key"])
        batch.drop_column("plan")
