"""The group-commit writer: what a batch commits when some of its items are refused,
raise, or were cancelled. Runs on SQLite (the HTTP tests cover both backends)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.server import db as dbmod
from gpufleet.server.models import Team
from gpufleet.server.problems import Failure, invalid
from gpufleet.server.writer import GroupCommitWriter

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
