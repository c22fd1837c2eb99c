"""The jobs list with each array's waiting tasks folded into one item (issue 35), as
``squeue`` shows a pending array: ``123_[5-9999]`` is one line, not 9,995.

An array's tasks that wait in the same state (PENDING, HELD) are one item: the row of
the lowest id among them (its place in id order, its position, ETA and reason), with
``array_tasks`` (``5-9999``, ``1-3,7,9-12``: Slurm's index list) and
``array_task_count``. The database does the folding: the items are the rows that are no
waiting task plus one row per (array, state) (``MIN(id) ... GROUP BY``), so a page of
100 items reads 100 rows however large the arrays; the index lists of the arrays on a
page are their lowest and highest ids where these say one run, else the runs of
consecutive ids (gaps and islands: ``task - ROW_NUMBER()`` is constant along a run), a
few rows per array. Paging by ``cursor`` stays stable: an
array's item is on the page of its lowest waiting id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, func, join, not_, or_, select
from sqlalchemy.orm import Session

from gpufleet.arrayspec import runs_text
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.store.models import Job, Team, User

WAITING = (str(JobState.PENDING), str(JobState.HELD))


def _waiting_task() -> ColumnElement[bool]:
    return and_(Job.array_job_id.is_not(None), Job.array_task_id.is_not(None), Job.state.in_(WAITING))


_FROM = join(Job, User, User.id == Job.user_id).join(Team, Team.id == Job.team_id)
"""The list's tables (``jobs._LIST_Q``'s): its filters name users' and teams' names."""


def folded(conds: Sequence[ColumnElement[bool]]) -> ColumnElement[bool]:
    """A condition on the list's query (``jobs`` joined to users and teams, ``conds``
    its filters but the cursor): a row that is no waiting task, or the first of its
    array's waiting tasks in its state among those ``conds`` match."""
    first = (
        select(func.min(Job.id))
        .select_from(_FROM)
        .where(*conds, _waiting_task())
        .group_by(Job.array_job_id, Job.state)
        .correlate(None)  # the same tables as the outer query's: not a correlated subquery
    )
    return or_(not_(_waiting_task()), Job.id.in_(first))


def tasks_of(
    s: Session, conds: Sequence[ColumnElement[bool]], firsts: Sequence[tuple[int, str]]
) -> dict[tuple[int, str], tuple[str, int]]:
    """(array, state) -> (index list, count) of the waiting tasks ``conds`` match, for
    these arrays (the folded items of a page). First each one's lowest, highest and
    count: where they say one run (``5-9999``, an array's usual waiting part), that is
    its list; only the others are read as runs (``_runs``)."""
    arrays = sorted({a for a, _ in firsts})
    if not arrays:
        return {}
    mine = [*conds, _waiting_task(), Job.array_job_id.in_(arrays)]
    q = (
        select(
            Job.array_job_id,
            Job.state,
            func.min(Job.array_task_id),
            func.max(Job.array_task_id),
            func.count(),
        )
        .select_from(_FROM)
        .where(*mine)
        .group_by(Job.array_job_id, Job.state)
    )
    out: dict[tuple[int, str], tuple[str, int]] = {}
    holed: list[int] = []
    rows: list[tuple[Any, ...]] = [tuple(r) for r in s.execute(q)]  # (the min and max: never NULL here)
    for array, state, lo, hi, n in rows:
        if int(hi) - int(lo) + 1 == int(n):
            out[(int(array), str(state))] = (runs_text([(int(lo), int(hi))]), int(n))
        else:
            holed.append(int(array))
    if holed:
        out |= _runs(s, [*conds, _waiting_task(), Job.array_job_id.in_(holed)])
    return out


def _runs(s: Session, conds: Sequence[ColumnElement[bool]]) -> dict[tuple[int, str], tuple[str, int]]:
    """The index lists of the matched tasks as runs of consecutive ids (gaps and islands:
    ``task - ROW_NUMBER()`` is constant along a run), a row per run."""
    run = Job.array_task_id - func.row_number().over(
        partition_by=(Job.array_job_id, Job.state), order_by=Job.array_task_id
    )
    inner = (
        select(Job.array_job_id, Job.state, Job.array_task_id, run.label("run"))
        .select_from(_FROM)
        .where(*conds)
        .subquery()
    )
    q = (
        select(
            inner.c.array_job_id,
            inner.c.state,
            func.min(inner.c.array_task_id),
            func.max(inner.c.array_task_id),
        )
        .add_columns(func.count())
        .group_by(inner.c.array_job_id, inner.c.state, inner.c.run)
        .order_by(inner.c.array_job_id, inner.c.state, func.min(inner.c.array_task_id))
    )
    runs: dict[tuple[int, str], list[tuple[int, int]]] = {}
    counts: dict[tuple[int, str], int] = {}
    for array, state, lo, hi, n in s.execute(q):
        key = (int(array), str(state))
        runs.setdefault(key, []).append((int(lo), int(hi)))
        counts[key] = counts.get(key, 0) + int(n)
    return {k: (runs_text(v), counts[k]) for k, v in runs.items()}


def fold_items(s: Session, conds: Sequence[ColumnElement[bool]], items: list[dict[str, Any]]) -> None:
    """Give each folded item of a page (the first waiting task of its array in its
    state) its ``array_tasks`` and ``array_task_count``; the other items get None."""
    firsts = [
        (int(i["array_job_id"]), str(i["state"]))
        for i in items
        if i["array_job_id"] is not None and i["array_task_id"] is not None and i["state"] in WAITING
    ]
    found = tasks_of(s, conds, firsts)
    for i in items:
        key = (i["array_job_id"], i["state"])
        text, count = found.get(key, (None, None)) if i["state"] in WAITING else (None, None)
        i["array_tasks"] = text
        i["array_task_count"] = count
