"""Job steps and job credentials (issue 31)

Reserved for one change; empty until it lands (a no-op revision keeps the chain linear).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
