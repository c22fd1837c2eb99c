"""``gpufleet reservation create|list|cancel`` (``gpufleet reserve`` and ``gpufleet
reservations``: the older names of create and list, kept).

Whom a reservation is for (its team and users: their jobs may run in it) is one thing,
who booked it (the API's ``owner``: they, or an operator, may cancel it) another; an
admin booking for team vision is the booker, vision the team. The list shows both.

Times: the CLI reads and shows *local* time (``TZ`` or the system's zone; ``localtime``);
the API and the database hold UNIX seconds (UTC). A repeat keeps the local wall-clock
time: the CLI sends its IANA zone name and the server steps in that zone.
"""

from __future__ import annotations

import time

import typer

from gpufleet.api.reservations import ReservationOut
from gpufleet.cli import words
from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.apps import reservation_app
from gpufleet.cli.localtime import local_zone, parse_start, show_time
from gpufleet.cli.options import flag, json_flag
from gpufleet.timefmt import format_duration, parse_duration


def _csv(value: str | None) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def for_whom(r: ReservationOut) -> str:
    """Whose jobs may use it: ``team vision``, ``alice, bob``, both, or maintenance."""
    if r.maintenance:
        return "maintenance"
    parts = ([f"team {r.team}"] if r.team else []) + list(r.users)
    return ", ".join(parts) or "-"


def _print(items: list[ReservationOut], zone: str) -> None:
    print_table(
        ("ID", "NAME", "TEAM", "USERS", "BOOKED BY", "STATE", "GPUS", "START", "END", "NODES", "REASON"),
        [
            (
                r.id,
                r.name[:24],
                r.team,
                ",".join(r.users) or None,
                r.owner,
                r.state,
                r.gpus,
                show_time(r.start, zone),
                show_time(r.end, zone),
                " ".join(f"{n}:{c}" for n, c in r.nodes),
                r.reason,
            )
            for r in items
        ],
    )


def reserve(
    gpus: int = typer.Option(0, "--gpus", min=0, help="GPUs in total (with --node: 0 = all of them)."),
    gpu_type: str | None = typer.Option(None, "--gpu-type"),
    nodes: int = typer.Option(0, "--nodes", min=0, help="Spread over exactly this many nodes."),
    gpus_per_node: int = typer.Option(0, "--gpus-per-node", min=0),
    start: str = typer.Option(..., "--start", help="Local ISO time (2026-12-03T09:00) or +2h."),
    duration: str = typer.Option(..., "--duration", help="4h, 90m, 1d..."),
    team: str | None = typer.Option(
        None, "--team", help="Book it for this team: its members' jobs may use it."
    ),
    users: str | None = typer.Option(
        None, "--users", help="Comma-separated users whose jobs may use it (default: you, unless --team)."
    ),
    name: str | None = typer.Option(None, "--name"),
    pool: str = typer.Option("default", "--pool", "-p"),
    repeat: str | None = typer.Option(None, "--repeat", help="daily or weekly (same local time)."),
    count: int = typer.Option(1, "--count", min=1, help="Windows in all, with --repeat."),
    node: str | None = typer.Option(None, "--node", help="Operators: these nodes (comma-separated)."),
    maintenance: bool = flag("--maintenance", help="Operators: keep the GPUs empty."),
    json_out: bool = json_flag("a line per window"),
) -> None:
    """Book GPUs for a window. Inside it only the jobs of those it is for (--team,
    --users) run there; you are the one who booked it."""
    zone = local_zone()
    if repeat not in (None, "daily", "weekly"):
        raise fail("--repeat: daily or weekly", BAD_INPUT)
    try:
        start_ts = parse_start(start, zone=zone, now=time.time())
        duration_s = parse_duration(duration)
    except ValueError as exc:
        raise fail(str(exc), BAD_INPUT) from None
    spec = {
        "start": start_ts,
        "duration_s": duration_s,
        "gpus": gpus,
        "gpus_per_node": gpus_per_node,
        "nodes": nodes,
        "gpu_type": gpu_type,
        "pool": pool,
        "team": team,
        "users": _csv(users),
        "name": name or "",
        "repeat": repeat,
        "count": count,
        "timezone": zone,
        "node_names": _csv(node),
        "maintenance": maintenance,
    }
    with client() as c:
        made = c.reserve(spec)
    if json_out:
        print_json([r.model_dump() for r in made])
        return
    for r in made:
        typer.echo(
            f"reservation {r.id}: {words.count(r.gpus, 'GPU')} "
            f"{show_time(r.start, zone)} - {show_time(r.end, zone)}"
            f" ({format_duration(r.end - r.start)}) on {' '.join(f'{n}:{k}' for n, k in r.nodes)}"
            f", for {for_whom(r)}"
        )


def reservations(
    all_: bool = flag("--all", help="Include past ones."),
    json_out: bool = json_flag(),
) -> None:
    """Reservations you may see (operators: all), times in local time.

    TEAM and USERS: whose jobs may run in it. BOOKED BY: who booked it (they, or an
    operator, may cancel it)."""
    with client() as c:
        items = c.reservations(include_past=all_)
    if json_out:
        print_json([r.model_dump() for r in items])
    else:
        _print(items, local_zone())


reservation_app.command("create")(reserve)  # the old spellings stay: `gpufleet reserve`, `reservations`
reservation_app.command("list")(reservations)


@reservation_app.command("cancel")
def cancel(reservation_id: int = typer.Argument(...)) -> None:
    """Cancel a reservation (whoever booked it, or an operator)."""
    with client() as c:
        r = c.cancel_reservation(reservation_id)
    typer.echo(f"reservation {r.id} {r.state.lower()}")


# local_zone, parse_start and show_time: still importable from here (gpufleet.demoworkload, tests)
__all__ = ["cancel", "for_whom", "local_zone", "parse_start", "reservations", "reserve", "show_time"]
