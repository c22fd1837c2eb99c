"""Predicted run times of jobs, and an index of when jobs ended (issue 33, predictions)

``jobs.predicted_s``: the job's total run time as the scheduling pass predicted it from
the history of ended jobs (``scheduler/predict.py``), written by the pass that first saw
the job (pending or running); ``jobs.predicted_conf`` (0..1) and ``jobs.prediction_basis``
(which history: ``user+name+gpus (12 jobs)``) beside it. NULL: no prediction (no history
enough yet, or a job that ended before predictions existed). ``ix_jobs_ended_at``: the
pass reads the jobs that ended since its last read (a watermark) and, at its start, the
most recent ones; without the index each read scanned every ended job. No change to any
row.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("predicted_s", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("predicted_conf", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("prediction_basis", sa.String(64), nullable=True))
    op.create_index("ix_jobs_ended_at", "jobs", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_ended_at", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("prediction_basis")
        batch_op.drop_column("predicted_conf")
        batch_op.drop_column("predicted_s")
