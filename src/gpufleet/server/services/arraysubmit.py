"""The tasks of a submitted job array after its first, and their "submitted" events, in
two ``INSERT ... SELECT`` statements (issue 35: 100,000 held tasks).

``submissions.insert_jobs`` inserts each job of a batch as one row with ``RETURNING
id``; an array's rows differ only in ``array_task_id``, and SQLAlchemy inserts rows
that must return their ids in order one statement a row on SQLite (no sentinel it can
sort by), each with its JSON columns encoded again: 0.66 s for a 10,000-task array.
Here the array's first task is that one row; every other task is a copy of it made by
the database (``SELECT`` of its columns joined to the list of indices, in index order:
ids ascend with the index), and the events are read back from the rows, their reason
(``submitted (task 7 of an array)``) built in SQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import JSON, Integer, String, cast, func, insert, literal, select, true
from sqlalchemy.engine import Connection

from gpufleet.server.jobstate.states import JobState
from gpufleet.server.store.models import Job

_T = Job.metadata.tables
_JOBS = _T["jobs"]
_EVENTS = _T["job_events"]
_COPIED = [c for c in _JOBS.c if c.name not in ("id", "array_task_id", "array_job_id")]


def reason(task: int | str, *, held: bool) -> str:
    """A task's "submitted" event's reason (``insert_jobs``'s, and this module's in SQL)."""
    return f"submitted (task {task} of an array){' held' if held else ''}"


def insert_rest(
    conn: Connection, *, first: int, indices: Sequence[int], at: float, actor: str, held: bool
) -> None:
    """The tasks ``indices`` (ascending, the first task's excluded) of the array whose
    first task's row is ``first`` (its ``array_job_id`` already set): copies of that
    row, then their events (``jobstate.transitions.event_row``'s columns: from none to
    PENDING, or HELD, at ``at`` by ``actor``)."""
    if indices:
        # the indices as one JSON parameter, a table of rows in SQL (no 10,000 parameters)
        listed = literal(json.dumps(list(indices)), String)
        if conn.dialect.name == "sqlite":
            idx = func.json_each(listed).table_valued("value").alias("idx")
        else:
            idx = func.json_array_elements_text(cast(listed, JSON)).table_valued("value").alias("idx")
        task = cast(idx.c.value, Integer)
        rows = (
            select(*_COPIED, task, literal(first, Integer))
            .select_from(_JOBS.join(idx, true()))
            .where(_JOBS.c.id == first)
            .order_by(task)
        )
        names = [*(c.name for c in _COPIED), "array_task_id", "array_job_id"]
        conn.execute(insert(_JOBS).from_select(names, rows))
    head, tail = reason("|", held=held).split("|")
    state = str(JobState.HELD if held else JobState.PENDING)
    events = select(
        _JOBS.c.id,
        literal(at, _EVENTS.c.at.type),
        literal(actor, _EVENTS.c.actor.type),
        literal(None, _EVENTS.c.from_state.type),
        literal(state, _EVENTS.c.to_state.type),
        literal(head, String) + cast(_JOBS.c.array_task_id, String) + literal(tail, String),
    ).where(_JOBS.c.array_job_id == first, _JOBS.c.id != first)
    cols = ["job_id", "at", "actor", "from_state", "to_state", "reason"]
    conn.execute(insert(_EVENTS).from_select(cols, events))
