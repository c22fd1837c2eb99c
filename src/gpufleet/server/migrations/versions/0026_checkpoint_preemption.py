"""Checkpoint-aware preemption (issue 33)

Jobs: ``checkpoint_s`` (``--checkpoint-every``: how often the job saves its state, in
seconds; NULL: not declared), and a preemption under way for a job that asked a signal
before it (``--signal``): ``preempt_at`` (when its grace ends and it is stopped),
``preempt_by`` (the job it makes room for, which waits until then) and
``preempt_reason`` (the plan's reason, written with the stop). NULL: none. Columns that
change nothing for existing rows.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("checkpoint_s", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("preempt_at", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("preempt_by", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("preempt_reason", sa.String(512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("preempt_reason")
        batch_op.drop_column("preempt_by")
        batch_op.drop_column("preempt_at")
        batch_op.drop_column("checkpoint_s")
