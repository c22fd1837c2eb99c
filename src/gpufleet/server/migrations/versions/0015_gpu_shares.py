"""GPU shares: an operator marks a GPU shared (``gpufleet node share``)

GPUs: ``shared`` (the GPU takes jobs asking for part of one, ``--gpu-fraction`` /
``--gpu-memory``, run under MPS; it is no longer handed out whole). A column that
changes nothing for existing rows.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gpus", sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_column("shared")
