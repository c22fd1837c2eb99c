"""inference services: services, their gateway tokens and events; replica columns on jobs

A replica is a job (``jobs.kind = 'service'``) with its service, slot and spec
generation, the endpoint its agent reports, whether it is ready, and when it was taken
out of the gateway (``draining_at``). Plain columns, no foreign key on ``jobs``: SQLite
adds them in place.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False, index=True),
        sa.Column("team_id", sa.Integer(), sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("scaled_replicas", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_table(
        "service_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "service_id",
            sa.Integer(),
            sa.ForeignKey("services.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("hint", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "service_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "service_id",
            sa.Integer(),
            sa.ForeignKey("services.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(140), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(512), nullable=False),
    )
    op.add_column("jobs", sa.Column("kind", sa.String(16), nullable=False, server_default="batch"))
    op.add_column("jobs", sa.Column("service_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("replica", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("generation", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("endpoint", sa.String(256), nullable=True))
    op.add_column("jobs", sa.Column("ready", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("ready_at", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("draining_at", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("warm", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_jobs_service_id", "jobs", ["service_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_service_id", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for col in (
            "draining_at",
            "ready_at",
            "ready",
            "endpoint",
            "generation",
            "replica",
            "service_id",
            "kind",
        ):
            batch_op.drop_column(col)
    op.drop_table("service_events")
    op.drop_table("service_tokens")
    op.drop_table("services")
