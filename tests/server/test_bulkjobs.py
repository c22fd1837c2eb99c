"""``services/bulkjobs`` in process on SQLite (no server): a bulk update that holds and
renames moves each job once, and a bulk cancel catches jobs that concurrent writers
moved between PENDING and HELD while its statements ran (the race PostgreSQL's read
committed allows, made deterministic here by a ``move_all`` that loses the first round)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from gpufleet.api.bulk import JobsChanged
from gpufleet.api.jobs import JobUpdate
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.services import bulkjobs
from gpufleet.server.services.auth import Principal
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import Job, JobEvent, Pool, Team, User

ALICE = Principal(user_id=1, name="alice", role="user")


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    dbmod.upgrade(url)
    database = dbmod.Database.connect(url)
    with database.write() as s:
        s.execute(insert(Team), [{"id": 1, "name": "t"}])
        s.execute(insert(User), [{"id": 1, "name": "alice", "role": "user", "created_at": 0.0}])
        s.execute(insert(Pool), [{"name": "p"}])
        row = {"name": "sweep", "user_id": 1, "team_id": 1, "pool": "p", "gpus": 1, "command": ["true"]}
        s.execute(
            insert(Job),
            [
                row
                | {"id": i, "env": {}, "state": "PENDING", "submit_time": 0.0, "pending_since": 0.0}
                | {"array_job_id": 1, "array_task_id": i - 1}
                for i in range(1, 6)
            ],
        )
    yield database
    database.dispose()


def events(database: dbmod.Database) -> dict[int, list[tuple[Any, str]]]:
    with database.read() as s:
        rows = s.execute(
            select(JobEvent.job_id, JobEvent.from_state, JobEvent.to_state).order_by(JobEvent.id)
        )
        out: dict[int, list[tuple[Any, str]]] = {}
        for jid, src, dst in rows:
            out.setdefault(int(jid), []).append((src, str(dst)))
    return out


def states(database: dbmod.Database) -> set[str]:
    with database.read() as s:
        return set(s.scalars(select(Job.state)))


def test_holding_and_renaming_moves_each_job_once(database: dbmod.Database) -> None:
    spec = JobUpdate(held=True, name="sweep2")
    out = bulkjobs.update_many(db=database, actor=ALICE, match=bulkjobs.Match(array=1), spec=spec, now=1.0)
    assert isinstance(out, JobsChanged)
    assert out.changed == [1, 2, 3, 4, 5] and out.skipped == []  # was each id twice
    assert events(database) == {i: [("PENDING", "HELD")] for i in range(1, 6)}  # was a HELD -> HELD too
    spec = JobUpdate(held=False, time_limit=60)
    out = bulkjobs.update_many(db=database, actor=ALICE, match=bulkjobs.Match(array=1), spec=spec, now=2.0)
    assert isinstance(out, JobsChanged) and out.changed == [1, 2, 3, 4, 5]
    assert all(len(ev) == 2 and ev[-1] == ("HELD", "PENDING") for ev in events(database).values())


def test_a_cancel_catches_jobs_moved_between_waiting_states_meanwhile(
    database: dbmod.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first statement of each state finds its jobs gone to the other waiting state
    (a concurrent hold, then a release): the next round cancels them all, once."""
    real = bulkjobs.move_all
    lost: list[JobState] = []

    def racing(s: Session, conds: Any, src: JobState, to: JobState, **kw: Any) -> list[int]:
        if len(lost) < 2:  # round one: each statement misses its jobs (moved under it)
            lost.append(src)
            other = JobState.HELD if src == JobState.PENDING else JobState.PENDING
            s.execute(update(Job).where(*conds, Job.state == str(src)).values(state=str(other)))
            return []
        return real(s, conds, src, to, **kw)

    monkeypatch.setattr(bulkjobs, "move_all", racing)
    with database.write() as s:
        conds = bulkjobs.where(ALICE, bulkjobs.Match(array=1))
        assert isinstance(conds, list)
        done = bulkjobs.cancel_waiting(s, conds, actor="alice", now=1.0)
    assert done == [1, 2, 3, 4, 5] and lost == [JobState.PENDING, JobState.HELD]
    assert states(database) == {"CANCELLED"}
    assert {i: ev[-1][1] for i, ev in events(database).items()} == {i: "CANCELLED" for i in range(1, 6)}
