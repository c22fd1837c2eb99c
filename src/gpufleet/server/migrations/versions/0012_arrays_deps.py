"""job arrays and dependencies: columns on jobs

``array_job_id`` (indexed: a whole array is cancelled, throttled and listed by it),
``array_task_id``, ``array_limit`` (``%N``), ``array_info`` (count, min, max),
``dependency`` and ``kill_on_invalid_dep``. Plain columns: SQLite adds them in place.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("array_job_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("array_task_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("array_limit", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("array_info", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("dependency", sa.String(1024), nullable=True))
    op.add_column(
        "jobs", sa.Column("kill_on_invalid_dep", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.create_index("ix_jobs_array_job_id", "jobs", ["array_job_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_array_job_id", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for col in (
            "kill_on_invalid_dep",
            "dependency",
            "array_info",
            "array_limit",
            "array_task_id",
            "array_job_id",
        ):
            batch_op.drop_column(col)
