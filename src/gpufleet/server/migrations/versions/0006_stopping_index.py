"""jobs waiting for a stop confirmation: a partial index (every agent sync asks)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

WHERE = sa.text("stopping_on IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_stopping_on", "jobs", ["stopping_on"], sqlite_where=WHERE, postgresql_where=WHERE
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_stopping_on", table_name="jobs")
