"""Rack power budgets (issue 34)

``rack_power``: a rack's feed in watts and the share kept free (``gpufleet admin rack
set``). ``power_figures``: an operator's board power for a GPU model, or board power and
base draw for a node, over the scheduler's defaults. New tables: nothing existing changes.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rack_power",
        sa.Column("rack", sa.String(64), primary_key=True),
        sa.Column("budget_w", sa.Float(), nullable=False),
        sa.Column("headroom", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(64), nullable=False),
        sa.CheckConstraint("budget_w > 0", name="ck_rack_power_budget"),
        sa.CheckConstraint("headroom >= 0 AND headroom < 1", name="ck_rack_power_headroom"),
    )
    op.create_table(
        "power_figures",
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("board_w", sa.Float(), nullable=True),
        sa.Column("base_w", sa.Float(), nullable=True),
        sa.CheckConstraint("kind IN ('model', 'node')", name="ck_power_figures_kind"),
        sa.CheckConstraint("board_w IS NULL OR board_w > 0", name="ck_power_figures_board"),
        sa.CheckConstraint("base_w IS NULL OR base_w >= 0", name="ck_power_figures_base"),
    )


def downgrade() -> None:
    op.drop_table("power_figures")
    op.drop_table("rack_power")
