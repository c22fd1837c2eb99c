"""``gpufleet price``, ``gpufleet usage``, ``gpufleet admin set-prices / set-budget``.

Prices' times are shown in the caller's local zone (``TZ``); the server keeps UNIX
seconds. Usage periods (``--month``, ``--from``/``--to``) are read by the server, and
shown, in the pricing time zone (the price schedule's, UTC without one), in whole hours:
where a month starts depends on it.
"""

from __future__ import annotations

import csv
import json
import sys
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import typer

from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.apps import admin_app
from gpufleet.cli.localtime import local_zone, show_time
from gpufleet.cli.options import flag, json_flag


def price(
    gpu_type: str | None = typer.Option(
        None, "--gpu-type", help="Only models matching this (H100 matches H100-80GB)."
    ),
    all_models: bool = flag("--all", help="Also the priced models the fleet has no GPU of."),
    json_out: bool = json_flag(),
) -> None:
    """GPU prices now, and when each GPU model gets cheaper (for work that can wait).

    Lists the models the fleet has; the schedule may price others too (--all)."""
    from gpufleet.scheduler import gpu_type_matches  # the scheduling core: only `price` needs it

    with client() as c:
        out = c.prices()
    if json_out:
        print_json(out.model_dump())
        return
    if out.schedule is None:
        typer.echo("no prices set: GPUs cost nothing (admins: gpufleet admin set-prices FILE)")
        return
    rows = [p for p in out.prices if gpu_type is None or gpu_type_matches(gpu_type, p.gpu_type)]
    fleet = {p.gpu_type for p in out.prices if p.in_fleet}
    if not rows:
        raise fail(f"no GPU model matching {gpu_type!r}; the fleet has {_names(fleet)}")
    shown = rows if all_models or not fleet else [p for p in rows if p.in_fleet]
    if not shown:
        raise fail(
            f"the fleet has no {gpu_type} GPU (it has {_names(fleet)}); --all shows the schedule's price"
        )
    zone = local_zone()
    print_table(
        ("GPU TYPE", "NOW/GPU-H", "BASE", "CHEAPER FROM", "THEN", "SAVES"),
        [
            (
                p.gpu_type if p.in_fleet or not fleet else f"{p.gpu_type} (not in fleet)",
                f"{p.price:.4g}",
                f"{p.base:.4g}",
                None if p.next_cheaper_at is None else show_time(p.next_cheaper_at, zone),
                None if p.next_cheaper_price is None else f"{p.next_cheaper_price:.4g}",
                None
                if p.next_cheaper_price is None or p.price <= 0
                else f"{100 * (1 - p.next_cheaper_price / p.price):.0f}%",
            )
            for p in shown
        ],
    )
    left_out = len(rows) - len(shown)
    if left_out:
        typer.echo(f"{left_out} priced model(s) the fleet has no GPU of left out (--all lists them)")
    if not fleet:
        typer.echo("no GPU registered yet: every model the schedule prices is listed")
    zone_name = out.schedule.get("timezone", "UTC")
    typer.echo(
        f"schedule set {show_time(out.set_at or time.time(), zone)} by {out.set_by}; "
        f"its hours and weekdays are {zone_name} time"
    )


def _names(models: set[str]) -> str:
    return ", ".join(sorted(models)) if models else "no GPU yet"


def usage(
    by: str = typer.Option("team", "--by", help="user, team, pool or gpu-type."),
    month: str | None = typer.Option(
        None, "--month", help="YYYY-MM in the pricing time zone (default: this month so far)."
    ),
    start: str | None = typer.Option(
        None, "--from", help="ISO date or date-time; without an offset, in the pricing time zone."
    ),
    end: str | None = typer.Option(None, "--to", help="As --from (default: now)."),
    csv_out: bool = flag("--csv", help="Print CSV instead of the table."),
    json_out: bool = json_flag(),
) -> None:
    """GPU-hours, cost, energy, jobs, utilisation and idle waste per user, team, pool or model.

    Periods are whole hours in the pricing time zone (the price schedule's; UTC without
    one), as budgets count them. Idle waste: GPU-hours allocated at under 5% utilisation.
    Admins see everyone; others see their teams."""
    if by not in ("user", "team", "pool", "gpu-type"):
        raise fail(f"--by: expected user, team, pool or gpu-type, got {by!r}", BAD_INPUT)
    with client() as c:
        rep = c.usage(by=by, month=month, start=start, end=end)
    if json_out:
        print_json(rep.model_dump())
        return
    cols = ("key", "jobs", "gpu_hours", "cost", "energy_kwh", "avg_util_pct", "idle_gpu_hours")
    rows: list[list[Any]] = [[getattr(r, k) for k in cols] for r in [*rep.rows, rep.total]]
    if csv_out:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow([by if k == "key" else k for k in cols])
        w.writerows(["" if v is None else v for v in r] for r in rows)
        return
    typer.echo(f"usage by {by}, {period(rep.start, rep.end, rep.timezone)}")
    print_table(
        (by.upper(), "JOBS", "GPU-HOURS", "COST", "ENERGY-KWH", "UTIL%", "IDLE GPU-H"),
        [[r[0], r[1], f"{r[2]:.1f}", f"{r[3]:.2f}", f"{r[4]:.1f}", r[5], f"{r[6]:.1f}"] for r in rows],
    )


def period(start: float, end: float, zone: str) -> str:
    """A report's period in the pricing time zone, named (``2026-12-01 00:00 to
    2026-12-04 00:00 Europe/Berlin``): where a month starts depends on it."""
    tz = ZoneInfo(zone)
    a, b = (datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M") for t in (start, end))
    return f"{a} to {b} {zone} (the pricing time zone)"


@admin_app.command("set-prices")
def set_prices(path: Path = typer.Argument(..., help="A JSON or .toml price schedule.")) -> None:
    """Put a price schedule in force from now (earlier usage keeps the old prices)."""
    try:
        text = path.read_text()
        body = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise fail(f"cannot read {path}: {exc}", BAD_INPUT) from None
    with client() as c:
        out = c.set_prices(body)
    typer.echo(f"prices set for {', '.join(p.gpu_type for p in out.prices) or 'no GPU model'}")


@admin_app.command("set-budget")
def set_budget(
    team: str = typer.Argument(...),
    soft: float | None = typer.Option(None, "--soft", min=0, help="Monthly spend that warns."),
    hard: float | None = typer.Option(None, "--hard", min=0, help="Monthly spend that holds new jobs."),
) -> None:
    """Set (or, without options, clear) a team's monthly budget."""
    with client() as c:
        t = c.set_budget(team, soft=soft, hard=hard)
    typer.echo(
        f"team {t.name}: soft {t.budget_soft if t.budget_soft is not None else 'none'}, "
        f"hard {t.budget_hard if t.budget_hard is not None else 'none'}, "
        f"spent {t.month_cost or 0:.2f} this month"
    )


__all__ = ["period", "price", "set_budget", "set_prices", "usage"]
