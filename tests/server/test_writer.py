"""The group-commit writer: what a batch commits when some of its items are refused,
raise, or were cancelled; agents' registrations, syncs and heartbeats through it. Runs
on SQLite (the HTTP tests cover both backends)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.api.nodes import GpuIn, NodeSync, SyncReply
from gpufleet.server.problems import Failure, Kind, invalid
from gpufleet.server.services import sync
from gpufleet.server.services.nodes import write_heartbeats
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.models import GpuRow, NodeRow, Team
from gpufleet.server.store.writer import GroupCommitWriter, InlineWriter

TEAMS = Team.metadata.tables["teams"]


def add_teams(s: Session, names: Sequence[str]) -> list[str | Failure]:
    """A BulkOp: names starting with "bad" are refused (and not written); a name that
    exists already makes the multi-row INSERT raise (unique constraint)."""
    out: list[str | Failure] = [invalid(f"refused {n}") if n.startswith("bad") else n for n in names]
    rows = [{"name": n} for n in names if not n.startswith("bad")]
    if rows:
        s.connection().execute(insert(TEAMS), rows)
    return out


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    dbmod.upgrade(url)
    database = dbmod.Database.connect(url)
    yield database
    database.dispose()


def teams(database: dbmod.Database) -> set[str]:
    with database.read() as s:
        return set(s.scalars(select(Team.name)))


def held_batch(writer: GroupCommitWriter, names: list[str]) -> list[Future[str | Failure]]:
    """Queue ``names`` while the writer is busy, so that they form one batch."""
    gate = threading.Event()
    blocker = writer.apply(lambda s, items: [gate.wait(10)], None)
    futs = [writer.apply(add_teams, n) for n in names]
    gate.set()
    blocker.result(10)
    return futs


CASES = [
    ("all-accepted", ["a", "b", "c"], {"a", "b", "c"}, {}),
    ("one-refused", ["a", "bad1", "c"], {"a", "c"}, {"bad1": Failure}),
    ("one-raises", ["a", "dup", "dup", "c"], {"a", "dup", "c"}, {"dup": IntegrityError}),
]


@pytest.mark.parametrize(("names", "written", "failing"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_batch_commits_all_but_the_failing_items(
    database: dbmod.Database, names: list[str], written: set[str], failing: dict[str, type]
) -> None:
    writer = GroupCommitWriter(database)
    try:
        futs = held_batch(writer, names)
        outcomes: list[object] = []
        for fut in futs:
            exc = fut.exception(10)
            outcomes.append(type(exc) if exc is not None else fut.result())
    finally:
        writer.close()
    assert teams(database) == written
    for name, got in zip(names, outcomes, strict=True):
        want = failing.get(name)
        if want is Failure:
            assert isinstance(got, Failure)
        elif want is not None and names.count(name) > 1:
            assert got in (name, want)  # the first of two duplicates wins
        else:
            assert got == name
    assert sum(1 for o in outcomes if o is IntegrityError) == sum(names.count(n) - 1 for n in set(names))


def test_a_cancelled_caller_writes_nothing(database: dbmod.Database) -> None:
    writer = GroupCommitWriter(database)
    try:
        gate = threading.Event()
        blocker = writer.apply(lambda s, items: [gate.wait(10)], None)
        kept, dropped = writer.apply(add_teams, "kept"), writer.apply(add_teams, "dropped")
        assert dropped.cancel()
        gate.set()
        assert blocker.result(10) is True
        assert kept.result(10) == "kept"
    finally:
        writer.close()
    assert teams(database) == {"kept"}


def test_run_rolls_back_a_failure(database: dbmod.Database) -> None:
    writer = GroupCommitWriter(database)

    def refuse(s: Session) -> Failure:
        s.add(Team(name="ghost"))
        s.flush()
        return invalid("changed my mind")

    try:
        assert isinstance(writer.run(refuse), Failure)
        assert writer.run(lambda s: add_teams(s, ["real"])) == ["real"]
    finally:
        writer.close()
    assert teams(database) == {"real"}


# -- agents' writes through the writer (registration, syncs, heartbeats) -----------------------


def register(writer: GroupCommitWriter, database: dbmod.Database, hot: AgentState, name: str) -> object:
    body = NodeSync(gpus=[GpuIn(index=i, model="H100") for i in range(2)], address="10.0.0.1")
    return sync.sync_node(
        db=database,
        writer=writer,
        hot=hot,
        actor=sync.AgentActor(name="admin", node=None),
        name=name,
        body=body,
        now=100.0,
    )


def test_registrations_share_commits_and_reply_after_them(database: dbmod.Database) -> None:
    """Fifty agents registering at once: every reply comes after its node is committed,
    and the writes took fewer transactions than agents."""
    writer, hot = GroupCommitWriter(database), AgentState()
    names = [f"n{i:02d}" for i in range(50)]
    replies: dict[str, object] = {}
    committed: dict[str, bool] = {}

    def agent(name: str) -> None:
        replies[name] = register(writer, database, hot, name)
        with database.read() as s:
            committed[name] = s.get(NodeRow, name) is not None

    try:
        gate = threading.Event()
        blocker = writer.apply(lambda s, items: [gate.wait(10)], None)
        threads = [threading.Thread(target=agent, args=(n,)) for n in names]
        for t in threads:
            t.start()
        gate.set()
        blocker.result(10)
        for t in threads:
            t.join(10)
    finally:
        writer.close()
    assert all(isinstance(r, SyncReply) and r.node == n for n, r in replies.items()) and len(replies) == 50
    assert all(committed[n] for n in names)
    with database.read() as s:
        assert s.scalar(select(func.count()).select_from(GpuRow)) == 100
    assert writer.batches < 1 + 50


def test_a_refused_sync_writes_nothing_next_to_others(database: dbmod.Database) -> None:
    writer, hot = GroupCommitWriter(database), AgentState()
    try:
        assert isinstance(register(writer, database, hot, "good"), SyncReply)
        unknown = sync.sync_node(
            db=database,
            writer=writer,
            hot=hot,
            actor=sync.AgentActor(name="admin", node=None),
            name="ghost",
            body=NodeSync(address="10.0.0.2"),
            now=100.0,
        )
    finally:
        writer.close()
    assert isinstance(unknown, Failure) and unknown.kind == Kind.NOT_FOUND
    with database.read() as s:
        assert set(s.scalars(select(NodeRow.name))) == {"good"}


def last_seen(database: dbmod.Database) -> dict[str, float | None]:
    with database.read() as s:
        return {n: t for n, t in s.execute(select(NodeRow.name, NodeRow.last_seen))}


def test_heartbeats_go_through_the_writer_and_stay_visible_until_committed(database: dbmod.Database) -> None:
    writer, hot = GroupCommitWriter(database), AgentState()
    try:
        for name in ("a", "b"):
            assert isinstance(register(writer, database, hot, name), SyncReply)  # last_seen 100
        gate = threading.Event()
        blocker = writer.apply(lambda s, items: [gate.wait(10)], None)
        hot.heartbeats.note("a", 150.0)
        hot.heartbeats.note("b", 50.0)  # older than the stored one: never moves it back
        hot.heartbeats.maybe_flush(writer, write_heartbeats)
        assert hot.heartbeats.latest() == {"a": 150.0, "b": 50.0}, "in flight: still reported"
        gate.set()
        blocker.result(10)
        writer.run(lambda s: None)  # the batch after the heartbeats' one
    finally:
        writer.close()
    assert hot.heartbeats.latest() == {}
    assert last_seen(database) == {"a": 150.0, "b": 100.0}


def test_failed_heartbeat_write_is_put_back(tmp_path: Path) -> None:
    hot = AgentState()
    empty = dbmod.Database.connect(f"sqlite:///{tmp_path / 'no-tables.db'}")  # the UPDATE fails
    try:
        hot.heartbeats.note("a", 1.0)
        hot.heartbeats.flush(InlineWriter(empty), write_heartbeats)
    finally:
        empty.dispose()
    assert hot.heartbeats.latest() == {"a": 1.0}
