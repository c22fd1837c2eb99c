"""Job steps (issue 31): ``srun`` inside an allocation

``job_steps`` (one row per step, ``JOB.N``), ``job_step_tasks`` (one per task: node, exit,
output stored so far) and ``job_step_output`` (the tasks' output, in stored order). New
tables only: nothing changes for existing rows. The job's own credential needs no column:
it is derived from the server's token key and the job's attempt (``services/steps.py``).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_steps",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("layout", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("stopping", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("job_id", "step", name="uq_job_steps_step"),
    )
    op.create_index("ix_job_steps_job_id", "job_steps", ["job_id"])
    op.create_table(
        "job_step_tasks",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("step_id", sa.Integer(), sa.ForeignKey("job_steps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("procid", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("killed", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("output_end", sa.BigInteger(), nullable=False, server_default="0"),
        sa.UniqueConstraint("step_id", "procid", name="uq_job_step_tasks_task"),
    )
    op.create_index("ix_job_step_tasks_step_id", "job_step_tasks", ["step_id"])
    op.create_table(
        "job_step_output",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("step_id", sa.Integer(), sa.ForeignKey("job_steps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("procid", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )
    op.create_index("ix_job_step_output_step_id_id", "job_step_output", ["step_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_step_output_step_id_id", table_name="job_step_output")
    op.drop_table("job_step_output")
    op.drop_index("ix_job_step_tasks_step_id", table_name="job_step_tasks")
    op.drop_table("job_step_tasks")
    op.drop_index("ix_job_steps_job_id", table_name="job_steps")
    op.drop_table("job_steps")
