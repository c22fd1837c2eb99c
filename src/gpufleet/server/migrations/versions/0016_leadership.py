"""Several servers on one PostgreSQL: the leader's lease, its terms, the servers

``leader_lease``: one row (``name`` "leader"): who leads (``holder``), the fencing token
(``epoch``, raised by every change of holder) and until when (``expires_at``, the
database's clock). ``leader_terms``: one row per epoch (who, since when). ``servers``:
each server process's heartbeat (``gpufleet status``). ``job_events.epoch``: the epoch of
the leader whose loop wrote the event (NULL: an API request or a single server), so a
stale leader's write would show. Tables and a column that change nothing for existing
rows.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(160), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "leader_terms",
        sa.Column("epoch", sa.BigInteger(), primary_key=True),
        sa.Column("holder", sa.String(160), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "servers",
        sa.Column("id", sa.String(160), primary_key=True),
        sa.Column("url", sa.String(512), nullable=False, server_default=""),
        sa.Column("version", sa.String(64), nullable=False, server_default=""),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
    )
    op.add_column("job_events", sa.Column("epoch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_column("epoch")
    op.drop_table("servers")
    op.drop_table("leader_terms")
    op.drop_table("leader_lease")
