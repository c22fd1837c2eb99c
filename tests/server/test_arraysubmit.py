"""Array tasks inserted as copies of the first task's row (``services/arraysubmit``), in
process on SQLite: a batch of submissions (what the group commit hands ``insert_jobs``)
mixing arrays and a plain job gives each task the row and the "submitted" event the
row-per-task insert gave, ids ascending with the index. The black-box array tests
(``test_arrays_deps.py``) run the same path on both databases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from gpufleet.api.jobs import JobDetail, JobSubmit
from gpufleet.server.services import submissions
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import Job, JobEvent, Pool, Team, User

ADMIN = Principal(user_id=1, name="admin", role="admin")


class OneBatch:
    """A writer that runs every submission it was given in ONE ``insert_jobs`` call."""

    def __init__(self, db: dbmod.Database) -> None:
        self.db = db
        self.items: list[tuple[Any, Any, Future[Any]]] = []

    def run(self, fn: Callable[[Session], Any]) -> Any:
        with self.db.write() as s:
            return fn(s)

    def apply(self, op: Any, item: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.items.append((op, item, fut))
        return fut

    def flush(self) -> None:
        op = self.items[0][0]
        with self.db.write() as s:
            out = op(s, [item for _, item, _ in self.items])
        for (_, _, fut), res in zip(self.items, out, strict=True):
            fut.set_result(res)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    dbmod.upgrade(url)
    database = dbmod.Database.connect(url)
    with database.write() as s:
        s.execute(insert(Team), [{"id": 1, "name": "t"}])
        s.execute(insert(User), [{"id": 1, "name": "admin", "role": "admin", "created_at": 0.0}])
        s.execute(insert(Pool), [{"name": "p"}])
    yield database
    database.dispose()


def test_a_batch_of_arrays_and_a_job_makes_every_task_as_a_copy_of_its_first(
    database: dbmod.Database,
) -> None:
    writer = OneBatch(database)
    base: dict[str, Any] = {
        "command": ["python", "t.py"],
        "gpus": 1,
        "pool": "p",
        "team": "t",
        "env": {"A": "1"},
    }
    specs = [
        JobSubmit(**base, name="a", array="0-9:3,20%2", hold=True, time_limit="1h"),
        JobSubmit(**base, name="plain"),
        JobSubmit(**base, name="b", array="5-7"),
    ]

    async def go() -> list[Any]:
        calls = [
            submissions.submit(writer=writer, actor=ADMIN, spec=sp, now=100.0, fleets=FleetCache())
            for sp in specs
        ]
        tasks = [asyncio.ensure_future(c) for c in calls]
        while len(writer.items) < len(specs):
            await asyncio.sleep(0)
        writer.flush()
        return list(await asyncio.gather(*tasks))

    a, plain, b = asyncio.run(go())
    assert isinstance(a, JobDetail) and isinstance(plain, JobDetail) and isinstance(b, JobDetail)
    with database.read() as s:
        jobs = list(s.scalars(select(Job).order_by(Job.id)))
        events = {e.job_id: e for e in s.scalars(select(JobEvent))}
        cols = [c.name for c in Job.__table__.c if c.name not in ("id", "array_task_id")]
        rows = {j.id: {c: getattr(j, c) for c in cols} for j in jobs}
    assert len(jobs) == 5 + 1 + 3 and len(events) == len(jobs)  # one event each
    for head, indices, state in ((a, [0, 3, 6, 9, 20], "HELD"), (b, [5, 6, 7], "PENDING")):
        tasks = [j for j in jobs if j.array_job_id == head.id]
        assert [t.array_task_id for t in tasks] == indices  # ids ascend with the index
        assert tasks[0].id == head.id == head.array_job_id
        assert all(rows[t.id] == rows[head.id] for t in tasks)  # every column the first's
        assert {t.state for t in tasks} == {state}
        held = " held" if state == "HELD" else ""
        for t in tasks:
            ev = events[t.id]
            assert (ev.from_state, ev.to_state, ev.actor, ev.at) == (None, state, "admin", 100.0)
            assert ev.reason == f"submitted (task {t.array_task_id} of an array){held}"
    first = rows[a.id]
    assert (first["time_limit_s"], first["env"], first["array_limit"]) == (3600.0, {"A": "1"}, 2)
    assert first["array_info"] == {"count": 5, "min": 0, "max": 20}
    assert plain.array_job_id is None and events[plain.id].reason == "submitted"
