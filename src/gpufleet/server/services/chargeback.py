"""Prices, usage reports and team budgets (the API side of ``server/store/ledger.py``).

Who sees what: everyone reads the prices; admins set them and budgets. A usage report
covers every job for admins; for anyone else only the jobs of their own teams (a team
sees its members' usage, nobody sees another team's).

Report periods: ``month=2026-12`` or ``start``/``end`` (ISO 8601 dates or date-times;
without an offset they are local times of the finance zone: the price schedule's time
zone, UTC without one), rounded outwards to whole UTC hours, the ledger's grain.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo

from pydantic import ValidationError
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from gpufleet.api.base import unstorable
from gpufleet.api.chargeback import PriceNow, PricesOut, UsageReport, UsageRowOut
from gpufleet.api.users import BudgetIn, TeamOut
from gpufleet.server.decide.pricing import PriceSchedule, parse_prices
from gpufleet.server.problems import Failure, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.users import team_out
from gpufleet.server.store import effects, ledger
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import GpuRow, Membership, Team, UsageRow, User

By = Literal["user", "team", "pool", "gpu-type"]
_HOUR = ledger.HOUR


# -- prices -----------------------------------------------------------------------------------


def _prices_out(s: Session, now: float) -> PricesOut:
    found = ledger.schedule_in_force(s)
    if found is None:
        return PricesOut(schedule=None, set_at=None, set_by=None, now=now, prices=[])
    schedule, row = found
    fleet = set(s.scalars(select(GpuRow.model).distinct()))
    models = fleet | {m for m in schedule.base if m != "*"}
    prices: list[PriceNow] = []
    for m in sorted(models):
        nxt = schedule.next_cheaper(m, now)
        prices.append(
            PriceNow(
                gpu_type=m,
                price=round(schedule.price(m, now), 6),
                base=schedule.base_price(m),
                next_cheaper_at=None if nxt is None else nxt[0],
                next_cheaper_price=None if nxt is None else round(nxt[1], 6),
                in_fleet=m in fleet,
            )
        )
    return PricesOut(schedule=row.body, set_at=row.created_at, set_by=row.created_by, now=now, prices=prices)


def get_prices(*, db: Database, now: float) -> PricesOut:
    with db.read() as s:
        return _prices_out(s, now)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(x) for x in err.get("loc", ())) or "body"
    return f"{where}: {err.get('msg', 'invalid')}"


def validate_schedule(body: dict[str, Any]) -> PriceSchedule | Failure:
    why = unstorable(body)  # what a request body refuses (``schemas.Request``), in the raw JSON
    if why is not None:
        return invalid(f"price schedule: {why}")
    try:
        return parse_prices(body)
    except ValidationError as exc:
        return invalid(f"price schedule: {_first_error(exc)}")
    except (KeyError, ValueError) as exc:  # an unknown time zone (ZoneInfoNotFoundError)
        return invalid(f"price schedule: {exc}")


def set_prices(
    *,
    db: Database,
    actor: Principal,
    body: dict[str, Any],
    now: float,
    readings: ledger.Readings = ledger.no_readings,
) -> PricesOut | Failure:
    """Put a new schedule in force from ``now``: what ran before is charged at the old
    prices (accrued in the same transaction)."""
    if not actor.is_admin:
        return forbidden("only admins set prices")
    schedule = validate_schedule(body)
    if isinstance(schedule, Failure):
        return schedule
    with db.write() as s:
        ledger.store_schedule(s, schedule, actor=actor.name, now=now, readings=readings)
        return _prices_out(s, now)


def ensure_prices(*, db: Database, schedule: PriceSchedule, actor: str, now: float) -> bool:
    """``gpufleet server --prices FILE``: store the file's schedule unless it is already
    the one in force. Returns whether it was stored."""
    with db.write() as s:
        found = ledger.schedule_in_force(s)
        if found is not None and found[0] == schedule:
            return False
        ledger.store_schedule(s, schedule, actor=actor, now=now)
        return True


# -- usage ------------------------------------------------------------------------------------


def _instant(text: str, zone: ZoneInfo) -> float:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value.timestamp()


def report_period(
    *, month: str | None, start: str | None, end: str | None, now: float, zone: str
) -> tuple[float, float] | Failure:
    """[start, end) in UNIX seconds, whole UTC hours (default: this month so far)."""
    tz = ZoneInfo(zone)
    if month is not None:
        if start is not None or end is not None:
            return invalid("month: give either month or from/to, not both")
        try:
            year, mon = (int(x) for x in month.split("-"))
            a, b = ledger.month_bounds(year, mon, zone)
        except ValueError:
            return invalid(f"month: expected YYYY-MM, got {month!r}")
    else:
        try:
            a = _instant(start, tz) if start else ledger.month_start(now, zone)
            b = _instant(end, tz) if end else now
        except ValueError as exc:
            return invalid(f"from/to: expected an ISO 8601 date or date-time ({exc})")
        if b <= a:
            return invalid("from/to: 'to' must be after 'from'")
    return math.floor(a / _HOUR) * _HOUR, math.ceil(b / _HOUR) * _HOUR


def _row_out(key: str, jobs: int, sums: tuple[float, ...]) -> UsageRowOut:
    gpu_s, cost, energy_wh, observed, util, idle = (float(x or 0.0) for x in sums)
    return UsageRowOut(
        key=key,
        jobs=jobs,
        gpu_hours=round(gpu_s / _HOUR, 4),
        cost=round(cost, 6),
        energy_kwh=round(energy_wh / 1000.0, 4),
        avg_util_pct=None if observed <= 0 else round(100.0 * util / observed, 2),
        idle_gpu_hours=round(idle / _HOUR, 4),
    )


def usage(
    *,
    db: Database,
    actor: Principal,
    by: By,
    month: str | None,
    start: str | None,
    end: str | None,
    now: float,
) -> UsageReport | Failure:
    with db.read() as s:
        zone = ledger.finance_zone(s)
        period = report_period(month=month, start=start, end=end, now=now, zone=zone)
        if isinstance(period, Failure):
            return period
        a, b = period
        sums = [func.sum(getattr(UsageRow, c)) for c in ledger.SUMS]
        where: list[ColumnElement[bool]] = [UsageRow.hour >= a, UsageRow.hour < b]
        if not actor.is_admin:
            mine = select(Membership.team_id).where(Membership.user_id == actor.user_id)
            where.append(UsageRow.team_id.in_(mine))
        keys: dict[str, Any] = {
            "user": User.name,
            "team": Team.name,
            "pool": UsageRow.pool,
            "gpu-type": UsageRow.gpu_type,
        }
        key = keys[by]
        q = select(key, func.count(func.distinct(UsageRow.job_id)), *sums).where(*where)
        if by == "user":
            q = q.join(User, User.id == UsageRow.user_id)
        elif by == "team":
            q = q.join(Team, Team.id == UsageRow.team_id)
        rows = [_row_out(str(k), int(n), tuple(rest)) for k, n, *rest in s.execute(q.group_by(key))]
        rows.sort(key=lambda r: (-r.cost, -r.gpu_hours, r.key))
        tot = s.execute(select(func.count(func.distinct(UsageRow.job_id)), *sums).where(*where)).one()
        total = _row_out("total", int(tot[0]), tuple(tot[1:]))
        return UsageReport(by=by, start=a, end=b, timezone=zone, rows=rows, total=total)


# -- budgets ----------------------------------------------------------------------------------


def set_budget(*, db: Database, actor: Principal, team: str, spec: BudgetIn, now: float) -> TeamOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins set budgets")
    if spec.soft is not None and spec.hard is not None and spec.soft > spec.hard:
        return invalid(
            f"soft {spec.soft:g} is above hard {spec.hard:g}: the warning would come after the hold"
        )
    with db.write() as s:
        t = s.scalar(select(Team).where(Team.name == team))
        if t is None:
            return not_found(f"no team {team}")
        t.budget_soft, t.budget_hard = spec.soft, spec.hard
        s.flush()
        effects.refresh_budgets(s)  # the warnings a submit reads
        effects.wake_scheduler(s)  # a hard budget holds or releases the team's jobs
        return team_out(s, t, now=now)


@dataclass(slots=True)
class BudgetWarnings:
    """Soft-budget warnings per team name, refreshed by the accrual tick, so a submit
    reads a dict instead of summing the ledger."""

    _warnings: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, team: str) -> str | None:
        return self._warnings.get(team)

    def refresh(self, db: Database, now: float) -> None:
        with db.read() as s:
            states = ledger.budgets(s, now)
        fresh = {b.team: b.warning() for b in states.values() if b.over_soft}
        with self._lock:
            self._warnings = fresh
