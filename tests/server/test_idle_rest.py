"""Loops at rest (``runner.Idle``): a pass that found nothing to do lets its loop sleep
until its earliest deadline (at least an interval, at most the cap) and a wake-up still
runs the next pass at once; the lifecycle pass at rest sleeps until the first node could
be declared lost, and keeps its interval while anything is in flight; the scheduling
pass with no job until the first live node could turn NotReady. In process, on
SQLite, with a fake clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from gpufleet.clock import FakeClock
from gpufleet.scheduler import make_policy
from gpufleet.server.loops.lifecycle import LifecycleConfig, LifecyclePass
from gpufleet.server.loops.scheduling import SchedulingPass
from gpufleet.server.runner import Idle, Loop
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.models import NodeRow

T0 = 1_000_000.0


@pytest.mark.parametrize(
    ("due", "wait"),
    [(None, 10.0), (0.0, 1.0), (-5.0, 1.0), (0.5, 1.0), (4.2, 4.2), (10.0, 10.0), (99.0, 10.0)],
)
def test_idle_sleeps_until_the_deadline_within_an_interval_and_the_cap(
    due: float | None, wait: float
) -> None:
    idle = Idle(1.0, 10.0)
    assert idle() == 1.0  # before any pass: one interval
    idle.until(due)
    assert idle() == wait
    idle.busy()
    assert idle() == 1.0
    short = Idle(2.0, 0.5)  # a cap under the interval: every interval
    short.until(None)
    assert short() == 2.0


def test_a_loop_at_rest_sleeps_and_a_wakeup_runs_the_next_pass_at_once() -> None:
    idle = Idle(0.01, 30.0)
    loop = Loop(name="t", interval_s=0.01, first_after_s=0, step=lambda: idle.until(None), rest=idle)
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while loop.passes < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.3)  # thirty intervals: a loop polling every interval would pass again
        assert loop.passes == 1
        loop.wake()
        deadline = time.monotonic() + 5
        while loop.passes < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert loop.passes == 2
    finally:
        loop.stop()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'idle.db'}"
    dbmod.upgrade(url)
    database = dbmod.Database.connect(url)
    yield database
    database.dispose()


def test_the_lifecycle_at_rest_sleeps_until_the_first_node_could_be_lost(database: dbmod.Database) -> None:
    clock = FakeClock(T0)
    with database.write() as s:
        s.add_all(
            [
                NodeRow(name=name, pool="default", created_at=T0 - 100, last_seen=T0 - ago)
                for name, ago in (("a", 5), ("b", 2))
            ]
        )
    hot = AgentState()
    config = LifecycleConfig(node_timeout_s=4.0, requeue_after_s=3.0, interval_s=1.0, idle_s=10.0)
    lc = LifecyclePass(db=database, hot=hot, clock=clock, config=config)
    lc.started_at = T0 - 100  # no (re)start sighting
    lc.run_once()
    assert lc.idle() == pytest.approx(2.05)  # a: last seen T0-5, lost after 7 s
    hot.heartbeats.note("a", T0)  # a sighting not flushed yet counts
    lc.run_once()
    assert lc.idle() == pytest.approx(5.05)  # now b first
    clock.advance(5.1)
    lc.run_once()
    assert lc.idle() == 1.0  # b declared lost: in flight until seen again
    with database.read() as s:
        assert s.get(NodeRow, "b").lost_at == pytest.approx(T0 + 5.1)  # type: ignore[union-attr]
    with database.write() as s:
        s.execute(update(NodeRow).where(NodeRow.name == "b").values(lost_at=None, last_seen=T0 + 5))
        s.execute(update(NodeRow).where(NodeRow.name == "a").values(drain_deadline=T0 + 60))
    lc.run_once()
    assert lc.idle() == 1.0  # a drain in flight
    with database.write() as s:
        s.execute(update(NodeRow).values(drain_deadline=None))
    lc.run_once()
    assert 1.0 < lc.idle() <= 10.0
    unbounded = LifecyclePass(db=database, hot=hot, clock=clock, config=LifecycleConfig(interval_s=1.0))
    unbounded.run_once()
    assert unbounded.idle() == 1.0  # idle_s no longer than the interval (HA): every interval


def test_the_scheduler_at_rest_sleeps_until_the_first_live_node_could_turn_not_ready(
    database: dbmod.Database,
) -> None:
    clock = FakeClock(T0)
    sched = SchedulingPass(db=database, policy=make_policy("default"), clock=clock, node_timeout_s=30.0)
    sched.run_once()
    assert sched.idle() == 10.0  # no node, no job: the cap
    with database.write() as s:
        s.add_all(
            [
                NodeRow(name=name, pool="default", created_at=T0 - 100, last_seen=T0 - ago)
                for name, ago in (("a", 26), ("b", 3), ("gone", 31))
            ]
        )
    sched.run_once()
    assert sched.idle() == pytest.approx(4.05)  # a turns NotReady at T0+4 ("gone" already has)
    clock.advance(4.1)
    sched.run_once()
    assert sched.idle() == pytest.approx(10.0)  # b next, at T0+27: past the cap
