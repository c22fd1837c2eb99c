"""agents: node credentials, node addresses, job logs

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("address", sa.String(length=256), nullable=True))

    op.create_table(
        "node_credentials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("hint", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    with op.batch_alter_table("node_credentials", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_credentials_node"), ["node"], unique=False)

    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.BigInteger(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", "node", "offset", name="uq_job_logs_chunk"),
    )
    with op.batch_alter_table("job_logs", schema=None) as batch_op:
        batch_op.create_index("ix_job_logs_job_id_id", ["job_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_logs", schema=None) as batch_op:
        batch_op.drop_index("ix_job_logs_job_id_id")
    op.drop_table("job_logs")
    with op.batch_alter_table("node_credentials", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_credentials_node"))
    op.drop_table("node_credentials")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("address")
