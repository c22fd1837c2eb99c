"""Prices, usage and budgets: ``gpufleet price``, ``gpufleet usage``, ``admin set-budget``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from gpufleet.api.chargeback import PricesOut, UsageReport
from gpufleet.api.users import BudgetIn, TeamOut
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.services import chargeback

router = APIRouter()


@router.get("/prices", response_model=PricesOut, tags=["prices"])
def get_prices(parts: PartsDep, me: Me) -> PricesOut:
    """The schedule in force, each GPU model's price now and its next cheaper window."""
    return chargeback.get_prices(db=parts.db, now=parts.now())


@router.put("/prices", response_model=PricesOut, tags=["prices"])
def put_prices(
    parts: PartsDep,
    me: Me,
    body: Annotated[dict[str, Any], Body(description="a price schedule (see `gpufleet server --prices`)")],
) -> PricesOut:
    """Admins: a new schedule, in force from now (earlier time keeps the old prices)."""
    return unwrap(
        chargeback.set_prices(db=parts.db, actor=me, body=body, now=parts.now(), readings=parts.readings)
    )


@router.get("/usage", response_model=UsageReport, tags=["usage"])
def get_usage(
    parts: PartsDep,
    me: Me,
    by: Annotated[chargeback.By, Query()] = "team",
    month: Annotated[str | None, Query(description="YYYY-MM (finance time zone)")] = None,
    start: Annotated[str | None, Query(alias="from", description="ISO 8601; default: start of month")] = None,
    end: Annotated[str | None, Query(alias="to", description="ISO 8601; default: now")] = None,
) -> UsageReport:
    """GPU-hours, cost, energy, jobs, utilisation and idle waste per user, team, pool or
    GPU model (admins: everyone; others: their teams)."""
    return unwrap(
        chargeback.usage(db=parts.db, actor=me, by=by, month=month, start=start, end=end, now=parts.now())
    )


@router.put("/teams/{name}/budget", response_model=TeamOut, tags=["teams"])
def set_budget(name: str, spec: BudgetIn, parts: PartsDep, me: Me) -> TeamOut:
    """Admins: a team's monthly budget. Soft warns (submit replies, alerts); hard holds
    its new jobs (they wait with the reason) until next month or a raise."""
    return unwrap(chargeback.set_budget(db=parts.db, actor=me, team=name, spec=spec, now=parts.now()))
