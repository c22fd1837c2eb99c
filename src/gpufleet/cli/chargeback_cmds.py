"""``gpufleet price``, ``gpufleet usage``, ``gpufleet admin set-prices / set-budget``.

Times are shown in the caller's local zone (``TZ``); the server keeps UNIX seconds. Usage
periods (``--month``, ``--from``/``--to``) are read by the server in its finance time
zone (the price schedule's), in whole hours.
"""

from __future__ import annotations

import csv
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.api_cmds import JSON_OPT, _client, _fail, _json, _table, admin_app
from gpufleet.cli.reservation_cmds import local_zone, show_time
from gpufleet.client import GpufleetClient
from gpufleet.server.schemas import JobOut


def price(
    gpu_type: str | None = typer.Option(None, "--gpu-type", help="Only this GPU model."),
    json_out: bool = JSON_OPT,
) -> None:
    """GPU prices now, and when each GPU model gets cheaper (for work that can wait)."""
    with _client() as c:
        out = c.prices()
    if json_out:
        _json(out.model_dump())
        return
    if out.schedule is None:
        typer.echo("no prices set: GPUs cost nothing (admins: gpufleet admin set-prices FILE)")
        return
    zone = local_zone()
    rows = [p for p in out.prices if gpu_type is None or p.gpu_type == gpu_type]
    if not rows:
        raise _fail(f"no GPU model {gpu_type!r} in the fleet or the price schedule")
    _table(
        ("GPU TYPE", "NOW/GPU-H", "BASE", "CHEAPER FROM", "THEN", "SAVES"),
        [
            (
                p.gpu_type,
                f"{p.price:.4g}",
                f"{p.base:.4g}",
                None if p.next_cheaper_at is None else show_time(p.next_cheaper_at, zone),
                None if p.next_cheaper_price is None else f"{p.next_cheaper_price:.4g}",
                None
                if p.next_cheaper_price is None or p.price <= 0
                else f"{100 * (1 - p.next_cheaper_price / p.price):.0f}%",
            )
            for p in rows
        ],
    )
    typer.echo(f"schedule set {show_time(out.set_at or time.time(), zone)} by {out.set_by}")


def price_hint(c: GpufleetClient, job: JobOut) -> list[str]:
    """What a just-submitted job costs per hour now and when it would be cheaper
    (``gpufleet submit`` prints it: work that can wait may be held and released
    off-peak). Empty when no prices are set."""
    if job.gpus == 0:
        return []
    out = c.prices()
    if out.schedule is None:
        return []
    zone = local_zone()
    if job.gpu_type:
        rows = [p for p in out.prices if p.gpu_type == job.gpu_type]
    else:  # the models the job could get: those in the fleet (all, before any node registered)
        rows = [p for p in out.prices if p.in_fleet] or out.prices
    lines = []
    for p in rows[:4]:
        line = f"{p.gpu_type} costs {p.price:.4g}/GPU-hour now ({job.gpus} GPUs: {p.price * job.gpus:.4g}/h)"
        if p.next_cheaper_at is not None and p.next_cheaper_price is not None:
            line += f"; {p.next_cheaper_price:.4g} from {show_time(p.next_cheaper_at, zone)}"
        lines.append(line)
    return lines


def usage(
    by: str = typer.Option("team", "--by", help="user, team, pool or gpu-type."),
    month: str | None = typer.Option(None, "--month", help="YYYY-MM (default: this month so far)."),
    start: str | None = typer.Option(None, "--from", help="ISO date or date-time (server's finance zone)."),
    end: str | None = typer.Option(None, "--to", help="ISO date or date-time (default: now)."),
    csv_out: bool = typer.Option(False, "--csv", help="Print CSV."),
    json_out: bool = JSON_OPT,
) -> None:
    """GPU-hours, cost, energy, jobs, utilisation and idle waste per user, team, pool or model.

    Idle waste: GPU-hours allocated at under 5% utilisation. Admins see everyone; others
    see their teams."""
    if by not in ("user", "team", "pool", "gpu-type"):
        raise _fail(f"--by: expected user, team, pool or gpu-type, got {by!r}", 2)
    with _client() as c:
        rep = c.usage(by=by, month=month, start=start, end=end)
    if json_out:
        _json(rep.model_dump())
        return
    cols = ("key", "jobs", "gpu_hours", "cost", "energy_kwh", "avg_util_pct", "idle_gpu_hours")
    rows: list[list[Any]] = [[getattr(r, k) for k in cols] for r in [*rep.rows, rep.total]]
    if csv_out:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow([by if k == "key" else k for k in cols])
        w.writerows(["" if v is None else v for v in r] for r in rows)
        return
    zone = local_zone()
    typer.echo(f"usage by {by}, {show_time(rep.start, zone)} to {show_time(rep.end, zone)}")
    _table(
        (by.upper(), "JOBS", "GPU-HOURS", "COST", "ENERGY-KWH", "UTIL%", "IDLE GPU-H"),
        [[r[0], r[1], f"{r[2]:.1f}", f"{r[3]:.2f}", f"{r[4]:.1f}", r[5], f"{r[6]:.1f}"] for r in rows],
    )


@admin_app.command("set-prices")
def set_prices(path: Path = typer.Argument(..., help="A JSON or .toml price schedule.")) -> None:
    """Put a price schedule in force from now (earlier usage keeps the old prices)."""
    try:
        text = path.read_text()
        body = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot read {path}: {exc}", 2) from None
    with _client() as c:
        out = c.set_prices(body)
    typer.echo(f"prices set for {', '.join(p.gpu_type for p in out.prices) or 'no GPU model'}")


@admin_app.command("set-budget")
def set_budget(
    team: str = typer.Argument(...),
    soft: float | None = typer.Option(None, "--soft", min=0, help="Monthly spend that warns."),
    hard: float | None = typer.Option(None, "--hard", min=0, help="Monthly spend that holds new jobs."),
) -> None:
    """Set (or, without options, clear) a team's monthly budget."""
    with _client() as c:
        t = c.set_budget(team, soft=soft, hard=hard)
    typer.echo(
        f"team {t.name}: soft {t.budget_soft if t.budget_soft is not None else 'none'}, "
        f"hard {t.budget_hard if t.budget_hard is not None else 'none'}, "
        f"spent {t.month_cost or 0:.2f} this month"
    )


def register(app: typer.Typer) -> None:
    app.command("price")(price)
    app.command("usage")(usage)
