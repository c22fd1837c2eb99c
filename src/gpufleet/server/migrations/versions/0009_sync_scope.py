"""columns wide enough for what the API accepts; the attempt a stopping node may finish

- ``jobs.stopping_on`` becomes TEXT (it joins the names of every node of a job that has
  to confirm a stop: 128 characters overflowed at two 63-character names plus one);
- ``job_events.actor`` becomes VARCHAR(140) (``node:<name>`` with the longest stored
  node name; 64 overflowed at node names of 60 characters);
- ``jobs.stopping_attempt``: the attempt the ``stopping_on`` nodes were told to stop
  (the only one they may still ship output for);
- the partial index of jobs waiting for a stop holds their ids, not ``stopping_on``
  (a B-tree entry is limited to a third of a page; a node list is not).

On SQLite a column's declared length and type are not enforced, and changing one would
mean recreating ``jobs`` (whose rows the foreign keys of ``job_events``, ``allocations``
and ``job_logs`` cascade from): the type changes are PostgreSQL's only.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

WHERE = sa.text("stopping_on IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_jobs_stopping_on", table_name="jobs")
    if _pg():
        op.alter_column("jobs", "stopping_on", type_=sa.Text(), existing_nullable=True)
        op.alter_column("job_events", "actor", type_=sa.String(140), existing_nullable=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stopping_attempt", sa.BigInteger(), nullable=True))
    op.create_index("ix_jobs_stopping", "jobs", ["id"], sqlite_where=WHERE, postgresql_where=WHERE)


def downgrade() -> None:
    op.drop_index("ix_jobs_stopping", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("stopping_attempt")
    if _pg():  # values that no longer fit are cut, as the old columns would have refused them
        op.execute("UPDATE job_events SET actor = LEFT(actor, 64) WHERE LENGTH(actor) > 64")
        op.alter_column("job_events", "actor", type_=sa.String(64), existing_nullable=False)
        op.execute("UPDATE jobs SET stopping_on = LEFT(stopping_on, 128) WHERE LENGTH(stopping_on) > 128")
        op.alter_column("jobs", "stopping_on", type_=sa.String(128), existing_nullable=True)
    op.create_index(
        "ix_jobs_stopping_on", "jobs", ["stopping_on"], sqlite_where=WHERE, postgresql_where=WHERE
    )


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"
