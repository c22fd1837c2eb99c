"""Rolling driver upgrades that verify (issue 34)

Rollouts: ``expect_driver`` (an upgrade: the driver each node must report afterwards;
NULL: a plain drain rollout), ``hook`` (the upgrade hook the agents run by name; NULL:
by hand) and ``pause_reason``. Rollout nodes: ``attempt`` (the upgrade order the agent
carries out), ``reason`` (why it failed), ``driver`` (what the last verification saw),
``phase_at``, and an index on ``node`` (each agent's sync asks for its own order).
Columns that change nothing for existing rows.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def _columns() -> dict[str, tuple[sa.Column[object], ...]]:
    """Fresh Column objects per table (a Column belongs to one table once added)."""
    return {
        "rollouts": (
            sa.Column("expect_driver", sa.String(64), nullable=True),
            sa.Column("hook", sa.String(64), nullable=True),
            sa.Column("pause_reason", sa.String(512), nullable=True),
        ),
        "rollout_nodes": (
            sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
            sa.Column("reason", sa.String(512), nullable=True),
            sa.Column("driver", sa.String(64), nullable=True),
            sa.Column("phase_at", sa.Float(), nullable=True),
        ),
    }


def upgrade() -> None:
    for table, cols in _columns().items():
        for col in cols:
            op.add_column(table, col)
    op.create_index("ix_rollout_nodes_node", "rollout_nodes", ["node"])


def downgrade() -> None:
    op.drop_index("ix_rollout_nodes_node", table_name="rollout_nodes")
    for table, cols in _columns().items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for col in reversed(cols):
                batch_op.drop_column(col.name)
