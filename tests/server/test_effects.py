"""After-commit effects (``server/store/effects.py``): what a transaction marks runs once it
has committed, through ``Database.write`` and the group-commit writer alike; never after
a rollback, nor for a group-commit SAVEPOINT rolled back beside committed neighbours; a
hook that raises leaves the write committed. A sync through the writer marks what it
changed (a new node: the fleet caches dropped, the scheduler woken). In process, on SQLite."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from gpufleet.api.nodes import GpuIn, NodeSync, SyncReply
from gpufleet.server.problems import Failure, conflict
from gpufleet.server.services import sync
from gpufleet.server.store import db as dbmod
from gpufleet.server.store import effects
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.effects import Effect
from gpufleet.server.store.models import Team
from gpufleet.server.store.writer import GroupCommitWriter, InlineWriter

TEAMS = Team.metadata.tables["teams"]


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    dbmod.upgrade(url)
    database = dbmod.Database.connect(url)
    yield database
    database.dispose()


class Hooks:
    """Every effect's hook, recording what ran and whether its team row was committed."""

    def __init__(self, database: dbmod.Database) -> None:
        self.database = database
        self.ran: list[tuple[Effect, frozenset[str]]] = []
        for effect in Effect:
            database.after_commit(effect, self.hook(effect))

    def hook(self, effect: Effect) -> Callable[[], None]:
        def run() -> None:
            with self.database.read() as s:  # what a woken loop reads: the commit is there
                teams = frozenset(s.scalars(select(TEAMS.c.name)))
            self.ran.append((effect, teams))

        return run

    def effects(self) -> list[Effect]:
        return [e for e, _ in self.ran]


def add_team(name: str, *marks: Effect, result: object = None) -> Callable[[Session], object]:
    def fn(s: Session) -> object:
        effects.mark(s, *marks)
        s.execute(insert(TEAMS), [{"name": name}])
        return name if result is None else result

    return fn


def test_a_write_runs_its_effects_after_the_commit_in_effect_order(database: dbmod.Database) -> None:
    hooks = Hooks(database)
    with database.write() as s:
        effects.wake_scheduler(s)
        effects.invalidate_fleets(s)
        effects.wake_scheduler(s)  # marked twice, run once
        s.execute(insert(TEAMS), [{"name": "t1"}])
        assert hooks.ran == []  # nothing before the commit
    assert hooks.ran == [
        (Effect.INVALIDATE_FLEETS, frozenset({"t1"})),
        (Effect.WAKE_SCHEDULER, frozenset({"t1"})),
    ]


def test_a_rolled_back_write_runs_nothing_and_leaves_nothing_for_the_next(database: dbmod.Database) -> None:
    hooks = Hooks(database)
    with pytest.raises(RuntimeError), database.write() as s:
        effects.wake_replicas(s)
        effects.touch(s, {"n1"})
        s.execute(insert(TEAMS), [{"name": "gone"}])
        raise RuntimeError("rolled back")
    with database.write() as s:  # a later write that marks nothing sets nothing off
        s.execute(insert(TEAMS), [{"name": "t2"}])
    assert hooks.ran == []


def test_a_hook_that_raises_leaves_the_write_committed_and_the_others_run(database: dbmod.Database) -> None:
    def broken() -> None:
        raise RuntimeError("hook bug")

    database.after_commit(Effect.INVALIDATE_FLEETS, broken)
    hooks = Hooks(database)
    with database.write() as s:
        effects.invalidate_fleets(s)
        effects.wake_lifecycle(s)
        s.execute(insert(TEAMS), [{"name": "t3"}])
    assert hooks.effects() == [Effect.INVALIDATE_FLEETS, Effect.WAKE_LIFECYCLE]


def test_the_group_commit_runs_only_what_its_committed_items_marked(database: dbmod.Database) -> None:
    """One batch: a committed item, one that returns a Failure and one that raises (each
    rolled back in its SAVEPOINT): only the first's marks run, after the commit."""
    hooks = Hooks(database)
    writer = GroupCommitWriter(database)
    gate = threading.Event()
    try:
        blocker = writer.apply(lambda s, items: [gate.wait(10)], None)  # the rest queue behind it
        while not blocker.running():
            threading.Event().wait(0.001)
        out: dict[str, object] = {}
        items = {
            "ok": add_team("ok", Effect.WAKE_SCHEDULER),
            "refused": add_team("refused", Effect.WAKE_REPLICAS, result=conflict("no")),
            "raised": add_team("ok", Effect.WAKE_LIFECYCLE),  # a duplicate name: IntegrityError
        }

        def call(key: str) -> None:
            try:
                out[key] = writer.run(items[key])
            except Exception as exc:
                out[key] = exc

        threads = []
        for key in items:  # in this order, so "ok" is written before its duplicate
            t = threading.Thread(target=call, args=(key,))
            t.start()
            threads.append(t)
            while writer._q.qsize() < len(threads):
                threading.Event().wait(0.001)
        gate.set()
        blocker.result(10)
        for t in threads:
            t.join(10)
    finally:
        writer.close()
    assert out["ok"] == "ok" and isinstance(out["refused"], Failure) and isinstance(out["raised"], Exception)
    assert writer.batches == 2  # the blocker, then the three together
    assert hooks.ran == [(Effect.WAKE_SCHEDULER, frozenset({"ok"}))]


@pytest.mark.parametrize("make_writer", [GroupCommitWriter, InlineWriter], ids=["group", "inline"])
def test_a_sync_through_the_writer_marks_what_it_changed(
    database: dbmod.Database, make_writer: Callable[[dbmod.Database], GroupCommitWriter | InlineWriter]
) -> None:
    """A node's first sync (new, new shape) drops the fleet caches and wakes the scheduler;
    the same again the next second changes nothing and sets nothing off."""
    hooks = Hooks(database)
    writer = make_writer(database)
    body = NodeSync(gpus=[GpuIn(index=i, model="H100") for i in range(2)], address="10.0.0.1")

    def once(now: float) -> object:
        return sync.sync_node(
            db=database,
            writer=writer,
            hot=AgentState(),
            actor=sync.AgentActor(name="admin", node=None),
            name="n1",
            body=body,
            now=now,
        )

    try:
        assert isinstance(once(100.0), SyncReply)
        assert hooks.effects() == [Effect.INVALIDATE_FLEETS, Effect.WAKE_SCHEDULER]
        assert isinstance(once(101.0), SyncReply)
    finally:
        if isinstance(writer, GroupCommitWriter):
            writer.close()
    assert hooks.effects() == [Effect.INVALIDATE_FLEETS, Effect.WAKE_SCHEDULER]
