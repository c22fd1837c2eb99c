"""CUDA at placement (issue 34)

Jobs: ``cuda`` (``--cuda``: the CUDA version a job needs, canonical ``12.4``; NULL:
any). Nodes: ``cuda_version`` (the newest CUDA its driver supports, as its agent
reports it; NULL: not reported). Columns that change nothing for existing rows.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cuda", sa.String(16), nullable=True))
    op.add_column("nodes", sa.Column("cuda_version", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("cuda_version")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("cuda")
