"""Push dispatch's doorbell (``server/store/dispatch.py``): a long-poll answered by a ring, by
a timeout, at once for a version it has not seen (a ring it missed, another boot), and
at shutdown; rings only after a commit, through ``Database.write`` and the group-commit
writer alike, and never for a rolled-back transaction. In process, on SQLite."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.server.store import db as dbmod
from gpufleet.server.store.dispatch import NodeBell, touch
from gpufleet.server.store.models import Team
from gpufleet.server.store.writer import GroupCommitWriter

TEAMS = Team.metadata.tables["teams"]


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_a_ring_answers_the_waiting_long_poll_with_a_new_version() -> None:
    bell = NodeBell()

    async def main() -> tuple[str, str, float]:
        seen = await bell.wait("n1", None, 5.0)  # the first answer is at once
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: threading.Thread(target=bell.ring, args=({"n1"},)).start())
        got = await bell.wait("n1", seen, 5.0)
        return seen, got, time.monotonic() - t0

    seen, got, took = run(main())  # type: ignore[misc]
    assert got != seen and took < 1.0
    assert bell.waiting == 0 and bell.rings == 1


def test_a_long_poll_times_out_with_the_same_version_and_others_nodes_do_not_wake_it() -> None:
    bell = NodeBell()

    async def main() -> tuple[str, str, float]:
        seen = bell.version("n1")
        asyncio.get_running_loop().call_later(0.05, bell.ring, {"n2"})
        t0 = time.monotonic()
        got = await bell.wait("n1", seen, 0.3)
        return seen, got, time.monotonic() - t0

    seen, got, took = run(main())  # type: ignore[misc]
    assert got == seen and took >= 0.25


@pytest.mark.parametrize("why", ["rung before the wait", "another boot", "closed"])
def test_a_version_the_agent_has_not_seen_answers_at_once(why: str) -> None:
    bell = NodeBell()
    seen = bell.version("n1")
    if why == "rung before the wait":  # a ring between two long-polls is never lost
        bell.ring({"n1"})
    elif why == "another boot":  # the agent waited on a server that restarted since
        seen = NodeBell().version("n1")
    else:
        bell.close()

    async def main() -> float:
        t0 = time.monotonic()
        await bell.wait("n1", seen, 5.0)
        return time.monotonic() - t0

    assert run(main()) < 0.1  # type: ignore[operator]


def test_close_answers_every_waiter() -> None:
    bell = NodeBell()

    async def main() -> list[str]:
        seen = bell.version("n1")
        waits = [
            asyncio.create_task(bell.wait(n, seen if n == "n1" else bell.version(n), 10))
            for n in ("n1", "n2")
        ]
        await asyncio.sleep(0.05)
        assert bell.waiting == 2
        bell.close()
        return list(await asyncio.wait_for(asyncio.gather(*waits), 2))

    assert len(run(main())) == 2  # type: ignore[arg-type]
    assert bell.waiting == 0


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    dbmod.upgrade(url)
    database = dbmod.Database.connect(url)
    yield database
    database.dispose()


def add_team(name: str, nodes: set[str]) -> object:
    def fn(s: Session) -> str:
        touch(s, nodes)
        s.execute(insert(TEAMS), [{"name": name}])
        return name

    return fn


def test_a_write_rings_its_nodes_after_the_commit_and_a_rollback_rings_nothing(
    database: dbmod.Database,
) -> None:
    rung: list[set[str]] = []
    seen_committed: list[bool] = []

    def bell(nodes: set[str]) -> None:
        with database.read() as s:  # what the woken agent will read: the write is there
            seen_committed.append(s.execute(TEAMS.select().where(TEAMS.c.name == "t1")).first() is not None)
        rung.append(nodes)

    database.on_ring(bell)
    with database.write() as s:
        touch(s, {"a", "b"})
        touch(s, {"b"})
        s.execute(insert(TEAMS), [{"name": "t1"}])
    assert rung == [{"a", "b"}] and seen_committed == [True]
    with pytest.raises(RuntimeError), database.write() as s:
        touch(s, {"c"})
        raise RuntimeError("rolled back")
    with database.write() as s:  # nothing touched: no ring
        s.execute(insert(TEAMS), [{"name": "t2"}])
    assert rung == [{"a", "b"}]


def test_the_group_commit_rings_the_union_of_its_batch_once_committed(database: dbmod.Database) -> None:
    rung: list[set[str]] = []
    database.on_ring(rung.append)
    writer = GroupCommitWriter(database)
    try:
        threads = [
            threading.Thread(target=writer.run, args=(add_team(f"g{i}", {f"n{i}"}),)) for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with pytest.raises(IntegrityError):  # a refused item (a duplicate name) is rolled back alone
            writer.run(add_team("g0", {"dup"}))
    finally:
        writer.close()
    assert set().union(*rung) >= {"n0", "n1", "n2", "n3"}
