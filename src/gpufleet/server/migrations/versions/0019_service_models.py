"""Loaded models of services (issue 30: service model load/unload)

``service_models``: one row per (service, model) a service wants loaded or unloaded on
every replica (``wanted``), who asked and when. ``jobs.model_states``: a replica's
wished models as its agent last reported them (JSON list, NULL: nothing reported). A
new table and a nullable column: nothing changes for existing rows.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_models",
        sa.Column(
            "service_id",
            sa.Integer(),
            sa.ForeignKey("services.id", ondelete="CASCADE"),
            primary_key=True,
            nullable=False,
        ),
        sa.Column("model", sa.String(128), primary_key=True, nullable=False),
        sa.Column("wanted", sa.String(16), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(140), nullable=False),
    )
    op.add_column("jobs", sa.Column("model_states", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("model_states")
    op.drop_table("service_models")
