"""a default team per user (Slurm's DefaultAccount), and the first admin's own team

- ``memberships.is_default``: the team a user's job is charged to when the submission
  names none (at most one per user; the service keeps it so). Existing users whose
  only team is one get it marked; users of several teams keep choosing per job until
  they set one (``PUT /v1/users/{name}/default-team``).

A plain column on ``memberships`` (not a foreign key on ``users``): SQLite adds it in
place, without the table copy that would cascade through ``users``' foreign keys.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "memberships", sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.execute(
        "UPDATE memberships SET is_default = TRUE WHERE user_id IN "
        "(SELECT user_id FROM memberships GROUP BY user_id HAVING COUNT(*) = 1)"
    )


def downgrade() -> None:
    with op.batch_alter_table("memberships", schema=None) as batch_op:
        batch_op.drop_column("is_default")
