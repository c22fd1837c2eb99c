"""chargeback: job cost and energy, the hourly usage ledger, price schedules, budgets

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cost", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("energy_wh", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("accrued_to", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("charge_model", sa.String(length=64), nullable=True))

    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.add_column(sa.Column("budget_soft", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("budget_hard", sa.Float(), nullable=True))

    op.create_table(
        "usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("hour", sa.Float(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("gpu_s", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("energy_wh", sa.Float(), nullable=False),
        sa.Column("observed_gpu_s", sa.Float(), nullable=False),
        sa.Column("util_gpu_s", sa.Float(), nullable=False),
        sa.Column("idle_gpu_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "hour", name="uq_usage_job_hour"),
    )
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.create_index("ix_usage_hour", ["hour"], unique=False)
        batch_op.create_index("ix_usage_team_hour", ["team_id", "hour"], unique=False)

    op.create_table(
        "price_schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("price_schedules")
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_team_hour")
        batch_op.drop_index("ix_usage_hour")
    op.drop_table("usage")
    with op.batch_alter_table("teams", schema=None) as batch_op:
        batch_op.drop_column("budget_hard")
        batch_op.drop_column("budget_soft")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("charge_model")
        batch_op.drop_column("accrued_to")
        batch_op.drop_column("energy_wh")
        batch_op.drop_column("cost")
