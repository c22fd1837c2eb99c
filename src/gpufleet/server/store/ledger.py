"""The cost ledger: cost, energy and utilisation accrued while a job holds GPUs
(prices, budgets and reports on top of it: ``services/chargeback.py``).

A job *accrues* from the moment the scheduler gives it GPUs (``accrued_to`` = that
time, ``charge_model`` = their model) until it lets them go (``release_attempt``: done,
cancelled, preempted, requeued, timed out). Accruing ``[accrued_to, now)`` adds

- cost: GPUs x hours x the price in force (``pricing.PriceSchedule.cost``: split at
  every time-of-day, weekday and midnight edge, with the job's priority multiplier);
- energy: the power each of its GPUs reports (the agent's latest NVML reading, if
  fresher than ``max_age_s``) x the time;
- utilisation: the same readings' utilisation x time, and the GPU-seconds observed at
  under ``IDLE_PCT`` (idle waste);

to the job row (``cost``, ``energy_wh``) and to the hourly ledger (``usage``: one row
per job per UTC hour), in the same transaction, moving ``accrued_to`` to ``now`` with a
compare-and-set. Accrual runs every ``--accrual-interval`` (``loops/accrual.py``) for every job holding
GPUs, when a job stops, and just before a new price schedule takes over: a schedule
change is exact, however long the job. Energy and utilisation are sampled at the ticks
(a reading stands for the time since the previous tick); the last partial tick of a job
that stops has cost but no sample.

Nothing is recomputed: ``gpufleet usage`` sums ledger rows, and those sums equal the
job rows' costs because both are written from the same numbers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpufleet.clock import Clock
from gpufleet.migindex import device_gpu, slice_parent_model, slice_share_of
from gpufleet.server.decide.pricing import PriceSchedule, parse_prices
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.models import Allocation, Job, PriceScheduleRow, Team, UsageRow

log = logging.getLogger("gpufleet.ledger")

HOUR = 3600.0
IDLE_PCT = 5.0
"""A GPU reading under this utilisation (percent) counts as idle waste."""
SUMS = ("gpu_s", "cost", "energy_wh", "observed_gpu_s", "util_gpu_s", "idle_gpu_s")


@dataclass(frozen=True, slots=True)
class Sample:
    """One GPU's latest reading: utilisation in percent, power in watts."""

    util_pct: float | None
    power_w: float | None


Readings = Callable[[str, int], Sample | None]
"""(node, GPU index) -> a fresh reading, or None (no telemetry: not observed)."""


def no_readings(node: str, index: int) -> None:
    return None


def telemetry_readings(hot: AgentState, clock: Clock, *, max_age_s: float) -> Readings:
    """Readings from the agents' latest telemetry (``hot.telemetry``: looked up at each
    call, the observability wiring swaps in its recording store), when fresh."""

    def read(node: str, index: int) -> Sample | None:
        t = hot.telemetry.get(node)
        if t is None or clock.now() - t.at > max_age_s:
            return None
        g = t.gpus.get(index)
        return None if g is None else Sample(g.utilization_pct, g.power_w)

    return read


# -- price schedules ------------------------------------------------------------------------


def schedule_in_force(s: Session) -> tuple[PriceSchedule, PriceScheduleRow] | None:
    """The newest stored schedule (None: no prices set, everything costs 0)."""
    row = s.scalars(select(PriceScheduleRow).order_by(PriceScheduleRow.id.desc()).limit(1)).first()
    return None if row is None else (parse_prices(row.body), row)


def store_schedule(
    s: Session, schedule: PriceSchedule, *, actor: str, now: float, readings: Readings = no_readings
) -> PriceScheduleRow:
    """Accrue every job under the old prices up to ``now``, then put ``schedule`` in force."""
    accrue_all(s, now, readings=readings)
    row = PriceScheduleRow(created_at=now, created_by=actor, body=schedule.model_dump(mode="json"))
    s.add(row)
    s.flush()
    return row


# -- accrual ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Open:
    id: int
    accrued_to: float
    gpus: int
    priority: int
    model: str
    user_id: int
    team_id: int
    pool: str
    warm: bool = False


_OPEN_COLS = (
    Job.id,
    Job.accrued_to,
    Job.gpus,
    Job.priority,
    Job.charge_model,
    Job.user_id,
    Job.team_id,
    Job.pool,
    Job.warm,
)


def _open(row: Sequence[Any]) -> _Open:
    jid, at, gpus, prio, model, uid, tid, pool, warm = row
    return _Open(jid, at, gpus, prio, model or "", uid, tid, pool, bool(warm))


def hours(start: float, end: float) -> Iterable[tuple[float, float, float]]:
    """``[start, end)`` cut at UTC hour edges: (hour start, piece start, piece end)."""
    a = start
    while a < end:
        hour = math.floor(a / HOUR) * HOUR
        b = min(end, hour + HOUR)
        yield hour, a, b
        a = b


Pricer = Callable[[str, float, float, int], float]
"""(GPU model, start, end, priority) -> cost of one GPU over [start, end)."""


def pricer(schedule: PriceSchedule | None) -> Pricer:
    """The schedule's per-GPU cost, memoised: the jobs an accrual tick visits mostly share
    their interval (the previous tick to this one), model and priority."""
    if schedule is None:
        return lambda model, a, b, priority: 0.0
    memo: dict[tuple[str, float, float, int], float] = {}

    def cost(model: str, a: float, b: float, priority: int) -> float:
        key = (model, a, b, priority)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = schedule.cost(model, a, b, gpus=1, priority=priority)
        return hit

    return cost


def measure(
    job: _Open,
    end: float,
    *,
    gpus_at: Sequence[tuple[str, int]],
    schedule: PriceSchedule | None,
    readings: Readings,
    price: Pricer | None = None,
) -> list[dict[str, Any]]:
    """Ledger increments (one per UTC hour) for ``[job.accrued_to, end)``."""
    price = price or pricer(schedule)
    # a MIG slice costs its share of its GPU (compute slices / 7) at the GPU's price, and
    # takes that share of the GPU's power, a GPU share's unit 1 % of both; its usage row
    # keeps the slice's model (by profile); observed and idle GPU-seconds scale alike
    share = slice_share_of(job.model)
    model = slice_parent_model(job.model)
    samples = [readings(node, device_gpu(idx)) for node, idx in gpus_at]
    watts = share * sum(x.power_w for x in samples if x is not None and x.power_w is not None)
    seen = [x.util_pct for x in samples if x is not None and x.util_pct is not None]
    idle = sum(1 for u in seen if u < IDLE_PCT)
    util = sum(min(100.0, max(0.0, u)) for u in seen) / 100.0
    out: list[dict[str, Any]] = []
    factor = schedule.warm if job.warm and schedule is not None else 1.0
    for hour, a, b in hours(job.accrued_to, end):
        dt = b - a
        cost = job.gpus * share * price(model, a, b, job.priority) * factor
        out.append(
            {
                "job_id": job.id,
                "hour": hour,
                "user_id": job.user_id,
                "team_id": job.team_id,
                "pool": job.pool,
                "gpu_type": job.model,
                "gpu_s": job.gpus * share * dt,
                "cost": cost,
                "energy_wh": watts * dt / HOUR,
                "observed_gpu_s": len(seen) * share * dt,
                "util_gpu_s": util * share * dt,
                "idle_gpu_s": idle * share * dt,
            }
        )
    return out


_UPSERTS: dict[str, Any] = {}


def _upsert(dialect: str) -> Any:
    """INSERT into the ledger, or on (job, hour) already there add to it (built once per
    dialect: building it is most of the cost of a small accrual)."""
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        ins = postgresql.insert(UsageRow) if dialect == "postgresql" else sqlite.insert(UsageRow)
        stmt = _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=["job_id", "hour"],
            set_={c: getattr(UsageRow, c) + getattr(ins.excluded, c) for c in SUMS},
        )
    return stmt


def _post(s: Session, rows: list[dict[str, Any]]) -> None:
    """Add ``rows`` to the ledger (one executemany)."""
    if rows:
        s.connection().execute(_upsert(s.get_bind().dialect.name), rows)


_ADVANCE = (
    update(Job)
    .where(Job.id == bindparam("jid"), Job.accrued_to == bindparam("was"))
    .values(
        accrued_to=bindparam("to"),
        cost=Job.cost + bindparam("dcost"),
        energy_wh=Job.energy_wh + bindparam("denergy"),
    )
)


def _apply(
    s: Session,
    job: _Open,
    end: float,
    *,
    close: bool,
    gpus_at: Sequence[tuple[str, int]],
    schedule: PriceSchedule | None,
    readings: Readings,
) -> bool:
    """Accrue one job to ``end``; False (nothing written) if another writer moved its
    ``accrued_to`` meanwhile."""
    end = max(end, job.accrued_to)
    rows = measure(job, end, gpus_at=gpus_at, schedule=schedule, readings=readings)
    res = s.execute(
        update(Job)
        .where(Job.id == job.id, Job.accrued_to == job.accrued_to)
        .values(
            accrued_to=None if close else end,
            cost=Job.cost + sum(r["cost"] for r in rows),
            energy_wh=Job.energy_wh + sum(r["energy_wh"] for r in rows),
        )
        .execution_options(synchronize_session=False)
    )
    if res.rowcount != 1:  # type: ignore[attr-defined]
        return False
    _post(s, rows)
    return True


def _placements(s: Session, ids: Sequence[int]) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    if not ids:
        return out
    q = select(Allocation.job_id, Allocation.node, Allocation.gpu_index).where(
        Allocation.job_id.in_(ids), Allocation.gpu_index.is_not(None)
    )
    for jid, node, idx in s.execute(q):
        out.setdefault(jid, []).append((node, idx))  # type: ignore[arg-type]
    return out


def close(s: Session, job_id: int, now: float, *, readings: Readings = no_readings) -> None:
    """The job lets its GPUs go at ``now`` (call before its allocations are deleted):
    accrue the rest and stop accruing. Inside the caller's transaction. ``readings``
    where the caller has them (the agent reporting the exit): a job shorter than the
    accrual tick still gets its energy and utilisation."""
    for _ in range(5):
        row = s.execute(select(*_OPEN_COLS).where(Job.id == job_id, Job.accrued_to.is_not(None))).first()
        if row is None:
            return
        job = _open(tuple(row))
        found = schedule_in_force(s)
        gpus_at = _placements(s, [job_id]).get(job_id, [])
        if _apply(
            s,
            job,
            now,
            close=True,
            gpus_at=gpus_at,
            schedule=None if found is None else found[0],
            readings=readings,
        ):
            return
    raise OperationalError("accrual", {}, RuntimeError(f"job {job_id}: accrued_to keeps moving"))


def accrue_all(s: Session, now: float, *, readings: Readings) -> int:
    """Accrue every job holding GPUs up to ``now``; returns how many were accrued. All of
    them in two statements (executemany): the open jobs are locked for the transaction
    (``FOR UPDATE`` on PostgreSQL; SQLite's write transaction excludes other writers), so
    no compare-and-set can fail."""
    q = select(*_OPEN_COLS).where(Job.accrued_to.is_not(None), Job.accrued_to < now).with_for_update()
    jobs = [_open(tuple(r)) for r in s.execute(q)]
    if not jobs:
        return 0
    found = schedule_in_force(s)
    schedule = None if found is None else found[0]
    price = pricer(schedule)
    where = _placements(s, [j.id for j in jobs])
    moves: list[dict[str, Any]] = []
    ledger: list[dict[str, Any]] = []
    for job in jobs:
        rows = measure(
            job, now, gpus_at=where.get(job.id, []), schedule=schedule, readings=readings, price=price
        )
        moves.append(
            {
                "jid": job.id,
                "was": job.accrued_to,
                "to": now,
                "dcost": sum(r["cost"] for r in rows),
                "denergy": sum(r["energy_wh"] for r in rows),
            }
        )
        ledger += rows
    res = s.connection().execute(_ADVANCE, moves)
    if s.get_bind().dialect.supports_sane_multi_rowcount and res.rowcount != len(moves):
        raise OperationalError("accrual", {}, RuntimeError("an accrued job moved during the tick"))
    _post(s, ledger)
    return len(moves)


# -- budgets ----------------------------------------------------------------------------------


def month_start(ts: float, zone: str) -> float:
    """The first instant of the calendar month holding ``ts`` in ``zone``."""
    local = datetime.fromtimestamp(ts, ZoneInfo(zone))
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_bounds(year: int, month: int, zone: str) -> tuple[float, float]:
    """[first instant, first instant of the next month) of ``year-month`` in ``zone``."""
    tz = ZoneInfo(zone)
    start = datetime(year, month, 1, tzinfo=tz)
    nxt = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=tz)
    return start.timestamp(), nxt.timestamp()


def finance_zone(s: Session) -> str:
    """Months and days are those of the price schedule's time zone (UTC without one)."""
    found = schedule_in_force(s)
    return "UTC" if found is None else found[0].timezone


def month_spend(s: Session, now: float, team_ids: Iterable[int] | None = None) -> dict[int, float]:
    """Cost per team so far this month (ledger rows; the open tick's seconds aside)."""
    since = math.floor(month_start(now, finance_zone(s)) / HOUR) * HOUR
    q = select(UsageRow.team_id, func.sum(UsageRow.cost)).where(UsageRow.hour >= since)
    if team_ids is not None:
        ids = list(team_ids)
        if not ids:
            return {}
        q = q.where(UsageRow.team_id.in_(ids))
    return {tid: float(c or 0.0) for tid, c in s.execute(q.group_by(UsageRow.team_id))}


@dataclass(frozen=True, slots=True)
class BudgetState:
    team: str
    spent: float
    soft: float | None
    hard: float | None

    @property
    def over_hard(self) -> bool:
        return self.hard is not None and self.spent >= self.hard

    @property
    def over_soft(self) -> bool:
        return self.soft is not None and self.spent >= self.soft

    def hold_reason(self) -> str:
        return (
            f"held: team {self.team} has spent {self.spent:.2f} of its monthly hard budget "
            f"{self.hard:.2f}; new jobs wait until next month or an admin raises it "
            f"(gpufleet admin set-budget {self.team} --hard N)"
        )

    def warning(self) -> str:
        return (
            f"team {self.team} has spent {self.spent:.2f} of its monthly budget "
            f"{self.soft:.2f} (soft limit reached"
            + (f"; new jobs are held at {self.hard:.2f})" if self.hard is not None else ")")
        )


def budgets(s: Session, now: float, team_ids: Iterable[int] | None = None) -> dict[int, BudgetState]:
    """Budget state of the teams that have a budget (all of them, or ``team_ids``)."""
    q = select(Team).where(Team.budget_soft.is_not(None) | Team.budget_hard.is_not(None))
    if team_ids is not None:
        q = q.where(Team.id.in_(list(team_ids)))
    teams = list(s.scalars(q))
    if not teams:
        return {}
    spent = month_spend(s, now, [t.id for t in teams])
    return {t.id: BudgetState(t.name, spent.get(t.id, 0.0), t.budget_soft, t.budget_hard) for t in teams}
