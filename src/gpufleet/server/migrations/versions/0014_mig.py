"""MIG on GPUs: what each node's agent reports, and the layout an operator asked for

GPUs: ``mig_enabled`` (MIG mode, as the agent reports it; NULL: not reported),
``mig_instances`` (its MIG devices, JSON), ``mig_pending`` (the layout asked for by
``gpufleet node mig`` and not yet applied, JSON; NULL: none), ``mig_error`` (why the node
could not apply the last one). Columns that change nothing for existing rows.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _columns() -> tuple[sa.Column[object], ...]:
    """Fresh Column objects (a Column belongs to one table once added)."""
    return (
        sa.Column("mig_enabled", sa.Boolean(), nullable=True),
        sa.Column("mig_instances", sa.JSON(), nullable=False, server_default="[]"),
        sa.Column("mig_pending", sa.JSON(), nullable=True),
        sa.Column("mig_error", sa.String(512), nullable=True),
    )


def upgrade() -> None:
    for col in _columns():
        op.add_column("gpus", col)


def downgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        for col in reversed(_columns()):
            batch_op.drop_column(col.name)
