"""Chargeback in process with a fake clock, on SQLite and PostgreSQL: cost over price
edges and schedule changes, energy and utilisation from readings, the hourly ledger
(usage sums equal job costs), budgets that warn and hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gpufleet.api.users import BudgetIn
from gpufleet.clock import FakeClock
from gpufleet.scheduler import make_policy
from gpufleet.server.decide.pricing import parse_prices
from gpufleet.server.loops.scheduling import SchedulingPass
from gpufleet.server.problems import Failure
from gpufleet.server.services import chargeback, jobs
from gpufleet.server.services.auth import Principal
from gpufleet.server.store import db as dbmod
from gpufleet.server.store import ledger
from gpufleet.server.store.models import GpuRow, Job, Membership, NodeRow, Team, UsageRow, User

from .conftest import scratch_postgres

# Monday 2026-12-07 21:00 UTC: an hour before the 22:00 off-peak edge.
T0 = datetime(2026, 12, 7, 21, 0, tzinfo=UTC).timestamp()
H = 3600.0
ADMIN = Principal(user_id=1, name="admin", role="admin")
ALICE = Principal(user_id=2, name="alice", role="user")
BOB = Principal(user_id=3, name="bob", role="user")
PRICES = {
    "timezone": "UTC",
    "base": {"H100": 2.0, "A100": 1.0},
    "windows": [{"start": "22:00", "end": "08:00", "multiplier": 0.5}],
}


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dbmod.Database]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'acc.db'}"
        else:
            url = stack.enter_context(scratch_postgres("accounting"))
        yield from _seeded(url)


def _seeded(url: str) -> Iterator[dbmod.Database]:
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    with db.write() as s:
        s.add_all(
            [
                User(id=1, name="admin", role="admin", created_at=0),
                User(id=2, name="alice", role="user", created_at=0),
                User(id=3, name="bob", role="user", created_at=0),
                Team(id=1, name="ml"),
                Team(id=2, name="vision"),
            ]
        )
        s.flush()
        s.add_all([Membership(user_id=2, team_id=1), Membership(user_id=3, team_id=2)])
        for name, model in (("h1", "H100"), ("a1", "A100")):
            s.add(NodeRow(name=name, pool="default", created_at=0, last_seen=T0))
            s.flush()
            s.add_all(GpuRow(node=name, index=i, model=model, memory_mb=1) for i in range(8))
    yield db
    db.dispose()


def _job(db: dbmod.Database, *, user: int, team: int, gpus: int, gpu_type: str, priority: int = 0) -> int:
    with db.write() as s:
        job = Job(
            name="j", user_id=user, team_id=team, pool="default", gpus=gpus, gpu_type=gpu_type,
            priority=priority, command=["x"], env={}, state="PENDING", submit_time=T0, pending_since=T0,
        )  # fmt: skip
        s.add(job)
        s.flush()
        return job.id


def _loop(db: dbmod.Database, clock: FakeClock) -> SchedulingPass:
    return SchedulingPass(db=db, policy=make_policy("default"), clock=clock, node_timeout_s=1e12)


def _set_prices(db: dbmod.Database, body: dict[str, object], now: float) -> None:
    out = chargeback.set_prices(db=db, actor=ADMIN, body=body, now=now)
    assert not isinstance(out, Failure), out


def _end(db: dbmod.Database, job_id: int, now: float) -> None:
    out = jobs.cancel(db=db, actor=ADMIN, job_id=job_id, now=now)
    assert not isinstance(out, Failure), out


def _row(db: dbmod.Database, job_id: int) -> Job:
    with db.read() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _ledger(db: dbmod.Database, job_id: int) -> list[tuple[float, float, float]]:
    with db.read() as s:
        q = select(UsageRow.hour, UsageRow.gpu_s, UsageRow.cost).where(UsageRow.job_id == job_id)
        return sorted(s.execute(q.order_by(UsageRow.hour)))


def test_cost_spans_the_off_peak_edge_and_is_split_per_hour(database: dbmod.Database) -> None:
    clock = FakeClock(T0)
    _set_prices(database, PRICES, T0 - H)
    jid = _job(database, user=2, team=1, gpus=2, gpu_type="H100")
    _loop(database, clock).run_once()
    assert _row(database, jid).state == "SCHEDULED"
    clock.t = T0 + 1.5 * H  # a tick in the middle: 21:00-22:30
    with database.write() as s:
        assert ledger.accrue_all(s, clock.t, readings=ledger.no_readings) == 1
    _end(database, jid, T0 + 2 * H)
    job = _row(database, jid)
    # 21-22: 2 GPUs x 1 h x 2.0; 22-23: 2 x 1 x 1.0 (x0.5 off-peak)
    assert job.cost == pytest.approx(6.0)
    assert job.accrued_to is None
    assert _ledger(database, jid) == [
        (T0, pytest.approx(2 * H), pytest.approx(4.0)),
        (T0 + H, pytest.approx(2 * H), pytest.approx(2.0)),
    ]


def test_a_new_schedule_applies_from_the_moment_it_is_set(database: dbmod.Database) -> None:
    clock = FakeClock(T0 - 3 * H)  # 18:00-20:00: peak hours only
    flat = {"timezone": "UTC", "base": {"H100": 2.0}}
    _set_prices(database, flat, clock.t)
    jid = _job(database, user=2, team=1, gpus=4, gpu_type="H100")
    _loop(database, clock).run_once()
    _set_prices(database, {**flat, "base": {"H100": 3.0}}, clock.t + 0.5 * H)
    _end(database, jid, clock.t + 2 * H)
    # 4 GPUs x 0.5 h x 2.0 + 4 x 1.5 h x 3.0
    assert _row(database, jid).cost == pytest.approx(4.0 + 18.0)


def test_priority_multiplier_and_model_price(database: dbmod.Database) -> None:
    clock = FakeClock(T0 - 3 * H)
    _set_prices(database, {"timezone": "UTC", "base": {"H100": 2.0, "A100": 1.0}, "priority_step": 0.5}, 0)
    hi = _job(database, user=2, team=1, gpus=1, gpu_type="H100", priority=2)
    a100 = _job(database, user=2, team=1, gpus=1, gpu_type="A100")
    _loop(database, clock).run_once()
    _end(database, hi, clock.t + H)
    _end(database, a100, clock.t + H)
    assert _row(database, hi).cost == pytest.approx(2.0 * (1 + 0.5 * 2))
    assert (_row(database, a100).cost, _row(database, a100).charge_model) == (pytest.approx(1.0), "A100")


def test_energy_and_utilisation_from_readings(database: dbmod.Database) -> None:
    clock = FakeClock(T0 - 3 * H)
    jid = _job(database, user=2, team=1, gpus=2, gpu_type="H100")
    _loop(database, clock).run_once()
    busy = {
        0: ledger.Sample(util_pct=50.0, power_w=400.0),
        1: ledger.Sample(util_pct=2.0, power_w=100.0),
    }

    def readings(node: str, index: int) -> ledger.Sample | None:
        return busy.get(index) if node == "h1" else None

    with database.write() as s:
        ledger.accrue_all(s, clock.t + H, readings=readings)
    job = _row(database, jid)
    assert job.energy_wh == pytest.approx(500.0)
    report = chargeback.usage(
        db=database, actor=ADMIN, by="user", month="2026-12", start=None, end=None, now=T0
    )
    assert not isinstance(report, Failure)
    (row,) = report.rows
    assert (row.key, row.gpu_hours, row.energy_kwh) == ("alice", 2.0, 0.5)
    assert row.avg_util_pct == pytest.approx(26.0)
    assert row.idle_gpu_hours == pytest.approx(1.0)
    assert job.cost == 0.0  # no prices set: free


def test_usage_sums_equal_job_costs_and_others_see_only_their_teams(database: dbmod.Database) -> None:
    clock = FakeClock(T0 - 5 * H)
    _set_prices(database, PRICES, 0)
    ids = [
        _job(database, user=2, team=1, gpus=3, gpu_type="H100"),
        _job(database, user=2, team=1, gpus=1, gpu_type="A100"),
        _job(database, user=3, team=2, gpus=2, gpu_type="H100"),
        _job(database, user=3, team=2, gpus=4, gpu_type="A100", priority=3),
    ]
    loop = _loop(database, clock)
    loop.run_once()
    for k, jid in enumerate(ids):  # ends at 17:00 .. 23:30+: some cross the 22:00 edge
        clock.t = T0 - 5 * H + (2.5 + 1.75 * k) * H
        with database.write() as s:
            ledger.accrue_all(s, clock.t - 0.3 * H, readings=ledger.no_readings)
        _end(database, jid, clock.t)
    costs = {jid: _row(database, jid).cost for jid in ids}
    assert all(c > 0 for c in costs.values())
    for by in ("user", "team", "pool", "gpu-type"):
        rep = chargeback.usage(db=database, actor=ADMIN, by=by, month="2026-12", start=None, end=None, now=T0)
        assert not isinstance(rep, Failure)
        assert sum(r.cost for r in rep.rows) == pytest.approx(sum(costs.values()), abs=1e-3)
        assert rep.total.cost == pytest.approx(sum(costs.values()), abs=1e-3)
        assert rep.total.jobs == 4
    mine = chargeback.usage(
        db=database, actor=ALICE, by="user", month="2026-12", start=None, end=None, now=T0
    )
    assert not isinstance(mine, Failure)
    assert [r.key for r in mine.rows] == ["alice"]
    assert mine.total.cost == pytest.approx(costs[ids[0]] + costs[ids[1]], abs=1e-3)
    with database.read() as s:  # the ledger and the job rows agree, row for row
        per_job = dict(
            s.execute(select(UsageRow.job_id, func.sum(UsageRow.cost)).group_by(UsageRow.job_id)).all()
        )
    assert per_job == {jid: pytest.approx(c) for jid, c in costs.items()}
    # A window of whole hours: only the ledger rows inside it.
    window = chargeback.usage(
        db=database,
        actor=ADMIN,
        by="team",
        month=None,
        start="2026-12-07T16:00",
        end="2026-12-07T17:00",
        now=T0,
    )
    assert not isinstance(window, Failure)
    assert window.total.gpu_hours == pytest.approx(3 + 1 + 2 + 4)


def test_hard_budget_holds_new_jobs_until_raised(database: dbmod.Database) -> None:
    clock = FakeClock(T0 - 4 * H)
    _set_prices(database, PRICES, 0)
    first = _job(database, user=2, team=1, gpus=2, gpu_type="H100")
    loop = _loop(database, clock)
    loop.run_once()
    out = chargeback.set_budget(
        db=database, actor=ADMIN, team="ml", spec=BudgetIn(soft=3.0, hard=4.0), now=clock.t
    )
    assert not isinstance(out, Failure)
    _end(database, first, clock.t + H)  # 2 GPUs x 1 h x 2.0 = 4.0: at the hard limit
    clock.t += H
    second = _job(database, user=2, team=1, gpus=1, gpu_type="H100")
    other = _job(database, user=3, team=2, gpus=1, gpu_type="H100")
    loop.run_once()
    held = _row(database, second)
    assert held.state == "PENDING"
    assert held.wait_reason is not None and held.wait_reason.startswith(
        "held: team ml has spent 4.00 of its monthly hard budget 4.00"
    )
    assert _row(database, other).state == "SCHEDULED"  # another team is not held
    team = chargeback.set_budget(
        db=database, actor=ADMIN, team="ml", spec=BudgetIn(soft=3.0, hard=10.0), now=clock.t
    )
    assert not isinstance(team, Failure)
    assert team.month_cost == pytest.approx(4.0)
    warnings = chargeback.BudgetWarnings()
    warnings.refresh(database, clock.t)
    assert (warnings.get("ml") or "").startswith("team ml has spent 4.00 of its monthly budget 3.00")
    assert warnings.get("vision") is None
    loop.run_once()
    assert _row(database, second).state == "SCHEDULED"


def test_budget_and_prices_are_admin_only_and_validated(database: dbmod.Database) -> None:
    denied = chargeback.set_budget(db=database, actor=ALICE, team="ml", spec=BudgetIn(hard=1.0), now=T0)
    assert isinstance(denied, Failure) and denied.kind.value == 403
    upside = chargeback.set_budget(db=database, actor=ADMIN, team="ml", spec=BudgetIn(soft=5, hard=1), now=T0)
    assert isinstance(upside, Failure) and upside.kind.value == 422
    for bad, says in (
        ({"timezone": "Mars/Olympus"}, "price schedule:"),
        ({"base": {"H100": "cheap"}}, "base.H100"),
        ({"windows": [{"start": "25:00", "end": "08:00", "multiplier": 0.5}]}, "windows.0.start"),
        ({"surprise": 1}, "surprise"),
    ):
        out = chargeback.set_prices(db=database, actor=ADMIN, body=bad, now=T0)
        assert isinstance(out, Failure) and out.kind.value == 422 and says in out.detail, out
    assert isinstance(chargeback.set_prices(db=database, actor=ALICE, body=PRICES, now=T0), Failure)
    assert chargeback.get_prices(db=database, now=T0).schedule is None  # nothing stored


def test_prices_now_and_next_cheaper(database: dbmod.Database) -> None:
    _set_prices(database, PRICES, 0)
    out = chargeback.get_prices(db=database, now=T0)
    h100 = next(p for p in out.prices if p.gpu_type == "H100")
    assert (h100.price, h100.next_cheaper_at, h100.next_cheaper_price) == (2.0, T0 + H, 1.0)
    assert chargeback.ensure_prices(db=database, schedule=parse_prices(PRICES), actor="file", now=T0) is False


@pytest.mark.parametrize(
    ("month", "start", "end", "want"),
    [
        ("2026-12", None, None, ("2026-11-30T23:00:00+00:00", "2026-12-31T23:00:00+00:00")),
        ("2026-03", None, None, ("2026-02-28T23:00:00+00:00", "2026-03-31T22:00:00+00:00")),  # DST: +1 -> +2
        (None, "2026-12-02", "2026-12-03T10:30", ("2026-12-01T23:00:00+00:00", "2026-12-03T10:00:00+00:00")),
        (None, "2026-12-02T00:00Z", None, ("2026-12-02T00:00:00+00:00", "2026-12-05T00:00:00+00:00")),
    ],
)
def test_report_periods_are_local_months_in_whole_hours(
    month: str | None, start: str | None, end: str | None, want: tuple[str, str]
) -> None:
    now = datetime(2026, 12, 4, 23, 10, tzinfo=UTC).timestamp()
    got = chargeback.report_period(month=month, start=start, end=end, now=now, zone="Europe/Berlin")
    assert not isinstance(got, Failure)
    assert tuple(datetime.fromtimestamp(x, UTC).isoformat() for x in got) == want


@pytest.mark.parametrize(
    ("month", "start", "end", "says"),
    [
        ("2026-13", None, None, "month: expected YYYY-MM"),
        ("2026-12", "2026-12-01", None, "not both"),
        (None, "yesterday", None, "ISO 8601"),
        (None, "2026-12-03", "2026-12-02", "'to' must be after 'from'"),
    ],
)
def test_bad_report_periods(month: str | None, start: str | None, end: str | None, says: str) -> None:
    got = chargeback.report_period(month=month, start=start, end=end, now=T0, zone="UTC")
    assert isinstance(got, Failure) and says in got.detail
