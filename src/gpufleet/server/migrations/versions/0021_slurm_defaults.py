"""Slurm's defaults: the default pool, node features, what a job excludes, QOS (issue 31)

Pools: ``is_default`` (Slurm's ``Default=YES``: a job that names no pool goes there; at
most one, kept by the service; none set: the pool ``default``). Nodes: ``features``
(what its agent reports, ``gpufleet agent --features``) and ``labels`` (what operators
add, ``gpufleet node label``), JSON lists matched by ``--constraint``. Jobs:
``constraint`` (``--constraint`` in canonical form, ``scheduler/features.py``) and
``exclude`` (``--exclude``: node names, JSON), ``qos``. A ``qos`` table (Slurm's QOS:
priority, per-user limits, preemptable, the default), a ``licenses`` table (Slurm's
``Licenses=``: a count per name) and ``jobs.licenses`` (``-L``, JSON). Columns that change nothing for
existing rows.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def _columns() -> dict[str, tuple[sa.Column[object], ...]]:
    """Fresh Column objects per table (a Column belongs to one table once added)."""
    return {
        "pools": (sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),),
        "nodes": (
            sa.Column("features", sa.JSON(), nullable=False, server_default="[]"),
            sa.Column("labels", sa.JSON(), nullable=False, server_default="[]"),
        ),
        "jobs": (
            sa.Column("constraint", sa.String(256), nullable=True),
            sa.Column("exclude", sa.JSON(), nullable=True),
            sa.Column("qos", sa.String(64), nullable=True),
            sa.Column("licenses", sa.JSON(), nullable=True),
        ),
    }


def upgrade() -> None:
    for table, cols in _columns().items():
        for col in cols:
            op.add_column(table, col)
    op.create_table(
        "qos",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("max_gpus_per_user", sa.Integer(), nullable=True),
        sa.Column("max_jobs_per_user", sa.Integer(), nullable=True),
        sa.Column("preemptable", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("description", sa.String(256), nullable=False, server_default=""),
    )
    op.create_table(
        "licenses",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("licenses")
    op.drop_table("qos")
    for table, cols in _columns().items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for col in reversed(cols):
                batch_op.drop_column(col.name)
