"""Loaded models of services (issue 30: service model load/unload)

Reserved for one change; empty until it lands (a no-op revision keeps the chain linear).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
