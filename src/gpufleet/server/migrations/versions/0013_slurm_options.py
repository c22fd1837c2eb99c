"""Slurm's batch options: CPU and memory as resources, files, signals, begin/deadline/price

Jobs: ``submit_dir``, ``workdir``, ``input``, ``signal``, ``cpus_per_task``,
``ntasks_per_node``, ``cpus_per_node``, ``mem_per_node_mb``, ``begin_at``, ``deadline``,
``max_price``. Nodes: ``cpus``, ``memory_mb`` (as their agents report them). Pools:
``default_cpus_per_gpu``, ``default_mem_per_cpu_mb``. Plain columns with defaults that
change nothing for existing rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _columns() -> dict[str, tuple[sa.Column[object], ...]]:
    """Fresh Column objects (a Column belongs to one table once added)."""
    return {"jobs": _jobs(), "nodes": _nodes(), "pools": _pools()}


def _jobs() -> tuple[sa.Column[object], ...]:
    return (
        sa.Column("submit_dir", sa.String(1024), nullable=True),
        sa.Column("workdir", sa.String(1024), nullable=True),
        sa.Column("input", sa.String(512), nullable=True),
        sa.Column("signal", sa.String(32), nullable=True),
        sa.Column("cpus_per_task", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("ntasks_per_node", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("cpus_per_node", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("mem_per_node_mb", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("begin_at", sa.Float(), nullable=True),
        sa.Column("deadline", sa.Float(), nullable=True),
        sa.Column("max_price", sa.Float(), nullable=True),
    )


def _nodes() -> tuple[sa.Column[object], ...]:
    return (
        sa.Column("cpus", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("memory_mb", sa.Integer(), nullable=False, server_default="0"),
    )


def _pools() -> tuple[sa.Column[object], ...]:
    return (
        sa.Column("default_cpus_per_gpu", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("default_mem_per_cpu_mb", sa.Integer(), nullable=False, server_default="0"),
    )


def upgrade() -> None:
    for table, cols in _columns().items():
        for col in cols:
            op.add_column(table, col)


def downgrade() -> None:
    for table, cols in _columns().items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for col in reversed(cols):
                batch_op.drop_column(col.name)
