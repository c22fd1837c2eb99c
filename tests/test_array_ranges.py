"""How an array's tasks are named when they are folded into one line (issue 35): the
index list from the runs the server computes (``arrayspec.runs_text``), from the
indices (``compact``), and the ids ``gpufleet queue`` and ``squeue`` print for a folded
listing item (``123_[5-9999]``, holes: ``123_[1-3,7,9-12]``). Pure: no server."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.arrayspec import compact, runs_text
from gpufleet.cli import slurmnames
from gpufleet.cli.job_cmds import queue_rows
from gpufleet.slurm import squeue
from gpufleet.slurm._common import job_label

CASES = [
    ("one run", [(5, 9999)], "5-9999"),
    ("holes", [(1, 3), (7, 7), (9, 12)], "1-3,7,9-12"),
    ("one task", [(4, 4)], "4"),
    ("a step of 4", [(0, 0), (4, 4), (8, 8)], "0,4,8"),
    ("two adjacent", [(0, 1)], "0-1"),
]


@pytest.mark.parametrize(("runs", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_runs_and_indices_name_the_same_list(runs: list[tuple[int, int]], want: str) -> None:
    assert runs_text(runs) == want
    assert compact([i for lo, hi in runs for i in range(lo, hi + 1)]) == want


IDS = [
    ("pending array", 123, "5-9999", 9995, "123_[5-9999]"),
    ("holes", 123, "1-3,7,9-12", 8, "123_[1-3,7,9-12]"),
    ("one task left", 123, "7", 1, "123_7"),
]


@pytest.mark.parametrize(("array", "tasks", "count", "want"), [c[1:] for c in IDS], ids=[c[0] for c in IDS])
def test_a_folded_item_is_one_id(array: int, tasks: str, count: int, want: str) -> None:
    assert slurmnames.folded_ids(array, tasks, count) == want
    item: dict[str, Any] = {"id": array, "array_job_id": array, "array_task_id": 1}
    item |= {"array_tasks": tasks, "array_task_count": count}
    assert job_label(item) == want


def test_array_ids_of_indices() -> None:
    assert slurmnames.array_ids(123, [9, 10, 11, 12, 1, 2, 3, 7]) == "123_[1-3,7,9-12]"
    assert slurmnames.array_ids(123, [5]) == "123_5"


def _item(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 200,
        "name": "sweep",
        "user": "alice",
        "team": "ml",
        "pool": "gpu",
        "state": "PENDING",
        "gpus": 1,
        "gpus_per_node": 1,
        "nodes": 1,
        "priority": 0,
        "time_limit_s": 60.0,
        "submit_time": 1000.0,
        "scheduled_at": None,
        "started_at": None,
        "ended_at": None,
        "allocation": [],
        "wait_reason": "Priority",
        "queue_position": 3,
        "estimated_start": None,
        "array_job_id": 195,
        "array_task_id": 5,
        "array_tasks": None,
        "array_task_count": None,
    }
    return base | over


def test_queue_and_squeue_show_a_folded_item_as_one_line() -> None:
    running = _item(id=195, state="RUNNING", array_task_id=0, allocation=[{"node": "n1", "gpus": [0]}])
    folded = _item(array_tasks="5-9999", array_task_count=9995)
    rows = queue_rows([running, folded])
    assert [r[0] for r in rows] == ["195_0", "195_[5-9999]"]
    cols, tail = squeue.parse_format("%i|%A|%a|%t")
    assert squeue.render([running, folded], cols, tail, header=False, now=2000.0) == [
        "195_0|195|0|R",
        "195_[5-9999]|195|[5-9999]|PD",
    ]


def test_queue_still_folds_the_tasks_of_a_server_that_lists_each() -> None:
    tasks = [_item(id=200 + t, array_task_id=t) for t in (1, 2, 3, 7, 9)]
    for t in tasks:
        del t["array_tasks"], t["array_task_count"]
    assert [r[0] for r in queue_rows(tasks)] == ["195_[1-3,7,9]"]
