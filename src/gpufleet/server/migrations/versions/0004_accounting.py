"""accounting: advance reservations (and the job's reservation)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reservation_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_reservation_id"), ["reservation_id"], unique=False)

    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("users", sa.JSON(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=False),
        sa.Column("node_map", sa.JSON(), nullable=False),
        sa.Column("maintenance", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=512), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.create_index("ix_reservations_state_end", ["state", "end"], unique=False)
        batch_op.create_index(batch_op.f("ix_reservations_owner_id"), ["owner_id"], unique=False)

    op.create_table(
        "reservation_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("reservation_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=512), nullable=False),
        sa.ForeignKeyConstraint(["reservation_id"], ["reservations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("reservation_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_reservation_events_reservation_id"), ["reservation_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("reservation_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reservation_events_reservation_id"))
    op.drop_table("reservation_events")
    with op.batch_alter_table("reservations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reservations_owner_id"))
        batch_op.drop_index("ix_reservations_state_end")
    op.drop_table("reservations")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_reservation_id"))
        batch_op.drop_column("reservation_id")
