"""Every generation's spec of a service, for ``gpufleet service rollback``

``service_specs``: one row per (service, generation) with the whole spec as it was when
that generation began, who made it and when. Services deployed before this revision
have no rows until their next generation (a rollback then says there is nothing to go
back to). A new table: nothing changes for existing rows.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_specs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "service_id", sa.Integer(), sa.ForeignKey("services.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(140), nullable=False),
        sa.UniqueConstraint("service_id", "generation", name="uq_service_specs_generation"),
    )
    op.create_index("ix_service_specs_service_id", "service_specs", ["service_id"])


def downgrade() -> None:
    op.drop_index("ix_service_specs_service_id", table_name="service_specs")
    op.drop_table("service_specs")
