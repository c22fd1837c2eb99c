"""An index of the unspent evidence against nodes (issue 34, the fleet page's suspect nodes)

``ix_job_diagnoses_suspect``: ``job_diagnoses(done_at)`` over the rows whose signature
blames the node and that no cordon has spent yet (partial: a small fraction of the
table). The fleet view reads that evidence within the suspicion window every second
(``services/diagnosisview.suspicions``); without it each read scanned every failed job
attempt ever diagnosed (23 ms at 200,000 rows on SQLite). No change to any row.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-11
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_job_diagnoses_suspect",
        "job_diagnoses",
        ["done_at"],
        sqlite_where=sa.text("blame = 'node' AND spent = 0"),
        postgresql_where=sa.text("blame = 'node' AND spent = false"),
    )


def downgrade() -> None:
    op.drop_index("ix_job_diagnoses_suspect", table_name="job_diagnoses")
