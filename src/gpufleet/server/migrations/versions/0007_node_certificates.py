"""node client certificates issued by the server's CA (mTLS for agents)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_certificates",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("serial", sa.String(64), nullable=False, unique=True),
        sa.Column("not_after", sa.Float(), nullable=False),
        sa.Column("credential_id", sa.Integer(), nullable=True),
        sa.Column("created_by", sa.String(140), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_node_certificates_node", "node_certificates", ["node"])


def downgrade() -> None:
    op.drop_index("ix_node_certificates_node", table_name="node_certificates")
    op.drop_table("node_certificates")
