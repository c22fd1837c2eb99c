"""Measured GPU power in the node row (issue 34, rack power budgets)

``nodes.gpu_power``: the node's latest per-GPU power readings as its agent reported them
(JSON ``{"<GPU index>": watts}``) and ``nodes.gpu_power_at``: when (the server's clock at
the sync that carried them). Written by the API process's heartbeat flush only when a
reading moved or is a minute old (``services/racks.write_gpu_power``); the scheduling
pass counts them for rack power (``services/racks.power_model``). NULL: no reading.
Columns that change nothing for existing rows.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("gpu_power", sa.JSON(), nullable=True))
    op.add_column("nodes", sa.Column("gpu_power_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("gpu_power_at")
        batch_op.drop_column("gpu_power")
