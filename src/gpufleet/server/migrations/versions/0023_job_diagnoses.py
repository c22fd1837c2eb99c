"""Failure diagnosis from job output (issue 34)

``jobs.diagnosis`` (JSON: the signature a failed job's output matched, its diagnosis,
hint, blame, node and line) and ``job_diagnoses`` (one row per failed attempt per node
whose log that node closed: the diagnosis loop's queue, then the evidence of a node's
suspicion). A new nullable column and a new table: nothing changes for existing rows.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("diagnosis", sa.JSON(), nullable=True))
    op.create_table(
        "job_diagnoses",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.BigInteger(), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("queued_at", sa.Float(), nullable=False),
        sa.Column("done_at", sa.Float(), nullable=True),
        sa.Column("signature", sa.String(64), nullable=True),
        sa.Column("blame", sa.String(8), nullable=True),
        sa.Column("line", sa.String(512), nullable=True),
        sa.Column("spent", sa.Boolean(), nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "node", name="uq_job_diagnoses_stream"),
    )
    op.create_index("ix_job_diagnoses_job_id", "job_diagnoses", ["job_id"])
    op.create_index("ix_job_diagnoses_node_signature", "job_diagnoses", ["node", "signature"])
    op.create_index(
        "ix_job_diagnoses_pending",
        "job_diagnoses",
        ["id"],
        sqlite_where=sa.text("done_at IS NULL"),
        postgresql_where=sa.text("done_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_job_diagnoses_pending", table_name="job_diagnoses")
    op.drop_index("ix_job_diagnoses_node_signature", table_name="job_diagnoses")
    op.drop_index("ix_job_diagnoses_job_id", table_name="job_diagnoses")
    op.drop_table("job_diagnoses")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("diagnosis")
