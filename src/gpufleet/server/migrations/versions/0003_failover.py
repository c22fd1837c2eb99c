"""failover: node lifecycle, per-GPU cordons, requeue policy, fleet events, rollouts

Revision ID: 0003
Revises: 0002
Create Date: 2025-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cordon_reason", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("lost_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("drain_deadline", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("drain_requeue", sa.Boolean(), nullable=False, server_default=sa.false())
        )

    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cordoned", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("cordon_reason", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("cordon_rule", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("cordoned_at", sa.Float(), nullable=True))

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_attempts", sa.Integer(), nullable=False, server_default="5"))
        batch_op.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("requeue_backoff_s", sa.Float(), nullable=False, server_default="10"))
        batch_op.add_column(sa.Column("not_before", sa.Float(), nullable=True))

    op.create_table(
        "gpu_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=512), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("gpu_events", schema=None) as batch_op:
        batch_op.create_index("ix_gpu_events_node_id", ["node", "id"], unique=False)

    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("max_unavailable", sa.Integer(), nullable=False),
        sa.Column("grace_s", sa.Float(), nullable=False),
        sa.Column("requeue", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.String(length=256), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "rollout_nodes",
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("rollout_id", "node"),
    )


def downgrade() -> None:
    op.drop_table("rollout_nodes")
    op.drop_table("rollouts")
    with op.batch_alter_table("gpu_events", schema=None) as batch_op:
        batch_op.drop_index("ix_gpu_events_node_id")
    op.drop_table("gpu_events")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for col in ("not_before", "requeue_backoff_s", "attempts", "max_attempts"):
            batch_op.drop_column(col)
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        for col in ("cordoned_at", "cordon_rule", "cordon_reason", "cordoned"):
            batch_op.drop_column(col)
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        for col in ("drain_requeue", "drain_deadline", "lost_at", "cordon_reason"):
            batch_op.drop_column(col)
