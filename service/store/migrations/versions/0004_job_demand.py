"""What each job asks of the cluster at its largest size, as columns: a tenant's quota check
sums them in SQL instead of reading and validating every active job's request.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _demand(request: dict) -> tuple[float, float]:
    """(CPUs, GPUs) of a stored request's scaling, with the request model's defaults (as
    `service.quotas.demand` computes them for new jobs); 0 for one that no longer reads."""
    from pydantic import ValidationError

    from eft.types.jobs import Scaling

    try:
        scaling = Scaling.model_validate((request or {}).get("scaling") or {})
    except (ValidationError, AttributeError):
        return 0.0, 0.0
    workers = scaling.resolved_max_workers
    return workers * scaling.cpus_per_worker, float(workers if scaling.use_gpu else 0)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("demand_cpus", sa.Float, nullable=False, server_default="0"))
        batch.add_column(sa.Column("demand_gpus", sa.Float, nullable=False, server_default="0"))
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("request", sa.JSON),
                    sa.column("demand_cpus", sa.Float), sa.column("demand_gpus", sa.Float))
    conn = op.get_bind()
    for job_id, request in conn.execute(sa.select(jobs.c.id, jobs.c.request)).all():
        cpus, gpus = _demand(request)
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(demand_cpus=cpus, demand_gpus=gpus))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("demand_gpus")
        batch.drop_column("demand_cpus")
