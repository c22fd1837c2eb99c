"""Where a step's tasks run (``services/steps.layout``): Slurm's defaults inside an
allocation and its block distribution, as a table run against the real function."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.api.steps import StepIn
from gpufleet.server.services.steps import layout

NODES = ("a", "b", "c", "d")


@pytest.mark.parametrize(
    ("options", "job_ntasks", "want"),
    [
        ({}, None, [["a", 1], ["b", 1], ["c", 1], ["d", 1]]),
        ({}, 8, [["a", 2], ["b", 2], ["c", 2], ["d", 2]]),
        ({"nodes": 2}, 8, [["a", 1], ["b", 1]]),
        ({"nodes": 2, "ntasks_per_node": 2}, None, [["a", 2], ["b", 2]]),
        ({"ntasks_per_node": 3}, None, [["a", 3], ["b", 3], ["c", 3], ["d", 3]]),
        ({"ntasks": 1}, None, [["a", 1]]),
        ({"ntasks": 6}, None, [["a", 2], ["b", 2], ["c", 1], ["d", 1]]),
        ({"ntasks": 5, "nodes": 2}, None, [["a", 3], ["b", 2]]),
        ({"ntasks": 5, "ntasks_per_node": 2}, None, [["a", 2], ["b", 2], ["c", 1]]),
        ({"ntasks": 2, "nodes": 4}, None, [["a", 1], ["b", 1]]),
    ],
    ids=[
        "all-nodes-one-each",
        "job-ntasks",
        "N-alone-one-per-node",
        "N-and-per-node",
        "per-node-alone",
        "n1-one-node",
        "n6-block",
        "n5-N2",
        "n5-per-node-2",
        "fewer-tasks-than-nodes",
    ],
)
def test_layout(options: dict[str, Any], job_ntasks: int | None, want: list[list[object]]) -> None:
    assert layout(NODES, StepIn(command=["x"], **options), job_ntasks) == want


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"nodes": 5}, "the allocation has 4 nodes"),
        ({"ntasks": 9, "nodes": 2, "ntasks_per_node": 4}, "do not fit 2 node(s)"),
    ],
    ids=["more-nodes-than-held", "tasks-over-per-node"],
)
def test_layout_refusals(options: dict[str, Any], why: str) -> None:
    got = layout(NODES, StepIn(command=["x"], **options))
    assert isinstance(got, str) and why in got
