"""``Job.stopping_on`` read and written as a list (``Job.stopping_nodes``, and
``stopping_list`` / ``stopping_value`` on a dict of column values): the column keeps its
comma-joined text, and NULL when no node is left to confirm (the partial index
``ix_jobs_stopping`` holds only the jobs that wait for a stop)."""

from __future__ import annotations

import pytest

from gpufleet.server.store.models import Job, stopping_list, stopping_value


@pytest.mark.parametrize(
    ("column", "nodes"),
    [
        (None, []),
        ("", []),
        ("n1", ["n1"]),
        ("n1,n2", ["n1", "n2"]),
        ("n1,,n2,", ["n1", "n2"]),
    ],
    ids=["null", "empty", "one", "two", "stray-commas"],
)
def test_a_column_value_reads_as_its_nodes(column: str | None, nodes: list[str]) -> None:
    assert stopping_list(column) == nodes
    assert Job(stopping_on=column).stopping_nodes == nodes


@pytest.mark.parametrize(
    ("nodes", "column"),
    [([], None), (["n1"], "n1"), (["n2", "n1"], "n2,n1")],
    ids=["none-is-null", "one", "order-kept"],
)
def test_nodes_write_the_column(nodes: list[str], column: str | None) -> None:
    assert stopping_value(nodes) == column
    job = Job(stopping_on="old")
    job.stopping_nodes = nodes
    assert job.stopping_on == column


def test_removing_a_node_leaves_the_others_and_the_last_clears_it() -> None:
    job = Job(stopping_on="node-1,node-10")
    job.stopping_nodes = [n for n in job.stopping_nodes if n != "node-1"]
    assert job.stopping_on == "node-10"  # a name that holds another is not removed with it
    job.stopping_nodes = [n for n in job.stopping_nodes if n != "node-10"]
    assert job.stopping_on is None
