"""How people see a predicted run time (issue 33), from the API's JSON: ``jobs show``'s
line (a running job's predicted end, a waiting one's predicted run, with the basis) and
``gpufleet queue``'s ETA column for a running job."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpufleet.cli.job_cmds import queue_rows
from gpufleet.cli.jobview import prediction_lines

BASIS = {"prediction_basis": "user+name+gpus (12 jobs)", "prediction_confidence": 0.8}


@pytest.mark.parametrize(
    ("job", "want"),
    [
        ({"predicted_s": None, "predicted_end": None}, []),
        (
            {"predicted_s": 600.0, "predicted_end": 1540.0},
            ["predicted end: in 9m00s, at ", "(from user+name+gpus (12 jobs), confidence 0.80)"],
        ),
        ({"predicted_s": 600.0, "predicted_end": 400.0}, ["predicted end: overdue by 10m00s, at "]),
        (
            {"predicted_s": 5400.0, "predicted_end": None},
            ["predicted run: 1h30m (from user+name+gpus (12 jobs), confidence 0.80)"],
        ),
    ],
    ids=["none", "running", "overdue", "waiting"],
)
def test_jobs_show_says_the_prediction_and_its_basis(job: dict[str, Any], want: list[str]) -> None:
    lines = prediction_lines(job | BASIS, now=1000.0)
    assert len(lines) == (1 if want else 0)
    assert all(part in lines[0] for part in want)


def _item(**over: Any) -> dict[str, Any]:
    base = {
        "id": 5,
        "name": "eval",
        "user": "ana",
        "state": "RUNNING",
        "gpus": 1,
        "gpu_type": None,
        "allocation": [{"node": "n1", "gpus": [0]}],
        "wait_reason": None,
        "queue_position": None,
        "estimated_start": None,
        "array_job_id": None,
        "array_task_id": None,
        "predicted_end": None,
    }
    return base | over


@pytest.mark.parametrize(
    ("ends_in", "eta"),
    [(None, "-"), (3600.4, "ends in 1h00m"), (-600.0, "overdue")],
    ids=["no-prediction", "ends", "overdue"],
)
def test_queue_shows_a_running_jobs_predicted_end(ends_in: float | None, eta: str) -> None:
    end = None if ends_in is None else time.time() + ends_in
    (row,) = queue_rows([_item(predicted_end=end)])
    assert row[6] == eta
