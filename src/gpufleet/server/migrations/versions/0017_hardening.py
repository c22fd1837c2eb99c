"""Issue 29's hardening: join tokens that expire and are used once.

``node_credentials.expires_at``: until when the join token may buy a node's certificate
(NULL: a token made before this revision, which never expires); ``used_at``: when it
bought one (NULL: not yet). Both nullable columns: nothing changes for existing rows.
A plain list of operations (other columns of this issue may join it). ``nodes.warning``:
what the node's agent says it cannot enforce (no usable cgroups: no job memory/pids
limits), shown on the page and by ``gpufleet nodes``; NULL: nothing.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("node_credentials", sa.Column("expires_at", sa.Float(), nullable=True))
    op.add_column("node_credentials", sa.Column("used_at", sa.Float(), nullable=True))
    op.add_column("nodes", sa.Column("warning", sa.String(512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("warning")
    with op.batch_alter_table("node_credentials", schema=None) as batch_op:
        batch_op.drop_column("used_at")
        batch_op.drop_column("expires_at")
