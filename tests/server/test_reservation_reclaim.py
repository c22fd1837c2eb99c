"""The scheduling pass and reservations, in process on SQLite with a fake clock:
idle reclaim (``--idle-release``), and the plan's reservation moves stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.clock import FakeClock
from gpufleet.scheduler import ReservationMove, make_policy
from gpufleet.server.loops.reservations import load_booked, step_reservations
from gpufleet.server.loops.scheduling import SchedulingPass
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import GpuRow, Job, NodeRow, ReservationEvent, ReservationRow, Team, User

T0 = 1_800_000_000.0
IDLE = 900.0


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    with db.write() as s:
        s.add_all([User(id=1, name="alice", role="user", created_at=0), Team(id=1, name="ml")])
        s.flush()
        for name in ("n1", "n2"):
            s.add(NodeRow(name=name, pool="default", created_at=0, last_seen=T0 + 10 * IDLE))
            s.flush()
            s.add_all(GpuRow(node=name, index=i, model="H100", memory_mb=1) for i in range(4))
    yield db
    db.dispose()


def _reservation(db: dbmod.Database, *, maintenance: bool = False) -> int:
    with db.write() as s:
        row = ReservationRow(
            name="r", owner_id=1, team=None, users=["alice"], pool="default", gpu_type=None, gpus=4,
            start=T0, end=T0 + 10 * IDLE, node_map=[["n1", 4]], maintenance=maintenance, state="BOOKED",
            reason="", version=0, created_at=0,
        )  # fmt: skip
        s.add(row)
        s.flush()
        return row.id


def _owner_job(db: dbmod.Database, rid: int) -> None:
    with db.write() as s:
        s.add(
            Job(
                name="j",
                user_id=1,
                team_id=1,
                pool="default",
                gpus=2,
                command=["x"],
                env={},
                state="PENDING",
                submit_time=T0,
                pending_since=T0,
                reservation_id=rid,
            )
        )


def _state(db: dbmod.Database, rid: int) -> ReservationRow:
    with db.read() as s:
        row = s.get(ReservationRow, rid)
        assert row is not None
        return row


@pytest.mark.parametrize(
    ("maintenance", "owner_job", "after_s", "want"),
    [
        (False, False, IDLE - 60, "BOOKED"),
        (False, False, IDLE + 1, "RELEASED"),
        (False, True, IDLE + 1, "BOOKED"),
        (True, False, IDLE + 1, "BOOKED"),
    ],
    ids=["idle-not-yet", "idle-released", "used-kept", "maintenance-kept"],
)
def test_idle_reclaim(
    database: dbmod.Database, maintenance: bool, owner_job: bool, after_s: float, want: str
) -> None:
    clock = FakeClock(T0 + 1)
    loop = SchedulingPass(
        db=database,
        policy=make_policy("default"),
        clock=clock,
        node_timeout_s=1e9,
        reservation_idle_release_s=IDLE,
    )
    rid = _reservation(database, maintenance=maintenance)
    if owner_job:
        _owner_job(database, rid)
    loop.run_once()
    clock.t = T0 + after_s
    loop.run_once()
    row = _state(database, rid)
    assert row.state == want
    if want == "RELEASED":
        assert row.reason == "released: no job of its owners used it for 15m00s"
        with database.read() as s:
            kinds = list(
                s.scalars(select(ReservationEvent.kind).where(ReservationEvent.reservation_id == rid))
            )
        assert kinds == ["released"]
    if owner_job:
        assert row.last_used_at is not None
        with database.read() as s:
            assert s.scalar(select(Job.state)) == "SCHEDULED"


def test_moves_are_stored(database: dbmod.Database) -> None:
    rid = _reservation(database)
    with database.write() as s:
        booked = load_booked(s, T0 + 1)
        move = ReservationMove(reservation=str(rid), from_node="n1", to_node="n2", gpus=3)
        step_reservations(
            s, booked=booked, running=(), moves=(move,), now=T0 + 1, idle_release_s=IDLE, actor="scheduler"
        )
    row = _state(database, rid)
    assert (row.node_map, row.version) == ([["n1", 1], ["n2", 3]], 1)
