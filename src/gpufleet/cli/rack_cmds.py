"""``gpufleet admin rack``: rack power budgets (issue 34). ``set RACK --power-kw 40
--headroom 30%`` declares a rack's feed; the scheduler then starts new work in the rack
only while its estimated draw stays within the feed less the headroom (the reason
``Power: rack r3 at 27.1/28.0 kW`` otherwise). ``figure`` overrides the default board
power of a GPU model or a node, or a node's base draw. Imports no server code.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import typer

from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.apps import admin_app
from gpufleet.cli.options import json_flag

rack_app = typer.Typer(help="Rack power budgets: each rack's feed, headroom and estimated draw (admins).")
admin_app.add_typer(rack_app, name="rack")


def parse_headroom(value: str) -> float:
    """``30%`` or ``0.3`` -> 0.3 (a share of the feed, 0 <= h < 1)."""
    text = value.strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise fail(f"--headroom: {value!r} is not a share like 30% or 0.3", BAD_INPUT) from None
    if not 0 <= share < 1:
        raise fail(f"--headroom: {value!r} must be at least 0 and under 100%", BAD_INPUT)
    return share


def _kw(v: float | None) -> str | None:
    return None if v is None else f"{v:.1f}"


def _line(r: dict[str, Any]) -> str:
    if r["power_kw"] is None:
        return f"rack {r['rack']}: no power budget, draws {_kw(r['draw_kw'])} kW (estimated)"
    return (
        f"rack {r['rack']}: {_kw(r['draw_kw'])}/{_kw(r['cap_kw'])} kW "
        f"(feed {r['power_kw']:g} kW, {r['headroom']:.0%} headroom)"
    )


@rack_app.command("set")
def rack_set(
    rack: str = typer.Argument(...),
    power_kw: float = typer.Option(..., "--power-kw", help="The rack's power feed, kW."),
    headroom: str = typer.Option("30%", "--headroom", help="The share of the feed kept free: 30% or 0.3."),
) -> None:
    """Declare a rack's power feed (admins). New jobs start in it only while its estimated
    draw stays within the feed less the headroom; running jobs are never stopped for it."""
    share = parse_headroom(headroom)
    with client() as c:
        got = c.request(
            "PUT", f"/racks/{quote(rack, safe='')}", json={"power_kw": power_kw, "headroom": share}
        )
    typer.echo(_line(got))


@rack_app.command("unset")
def rack_unset(rack: str = typer.Argument(...)) -> None:
    """Forget a rack's power budget (nothing holds its jobs back for power from then on)."""
    with client() as c:
        got = c.request("DELETE", f"/racks/{quote(rack, safe='')}")
    typer.echo(_line(got))


@rack_app.command("list")
def rack_list(json_out: bool = json_flag()) -> None:
    """Every rack: its nodes and GPUs, busy GPUs, estimated draw and its budget."""
    with client() as c:
        items = c.request("GET", "/racks")["items"]
    if json_out:
        print_json(items)
        return
    print_table(
        ("RACK", "NODES", "GPUS", "BUSY", "DRAW_KW", "CAP_KW", "FEED_KW", "HEADROOM"),
        [
            (
                i["rack"],
                i["nodes"],
                i["gpus"],
                i["busy_gpus"],
                _kw(i["draw_kw"]),
                _kw(i["cap_kw"]),
                None if i["power_kw"] is None else f"{i['power_kw']:g}",
                None if i["headroom"] is None else f"{i['headroom']:.0%}",
            )
            for i in items
        ],
    )


@rack_app.command("figure")
def rack_figure(
    model: str | None = typer.Option(None, "--model", help="A GPU model, as nodes report it."),
    node: str | None = typer.Option(None, "--node", help="A node."),
    board_watts: float | None = typer.Option(None, "--board-watts", help="A GPU's board power (TDP), W."),
    base_watts: float | None = typer.Option(None, "--base-watts", help="A node's draw besides its GPUs, W."),
    unset: bool = typer.Option(False, "--unset", help="Forget the figures of this model or node."),
) -> None:
    """Override the scheduler's power figures (admins): a GPU model's board power, or a
    node's GPUs' board power and its base draw (CPUs, fans, NICs)."""
    if (model is None) == (node is None):
        raise fail("give one of --model or --node", BAD_INPUT)
    kind, name = ("model", model) if model is not None else ("node", node)
    assert name is not None
    with client() as c:
        if unset:
            got = c.request("DELETE", f"/power-figures/{kind}/{quote(name, safe='')}")
            typer.echo(f"{kind} {got['name']}: figures forgotten")
            return
        body = {"kind": kind, "name": name, "board_w": board_watts, "base_w": base_watts}
        got = c.request("PUT", "/power-figures", json=body)
    typer.echo(f"{kind} {got['name']}: board {got['board_w'] or '-'} W, base {got['base_w'] or '-'} W")


@rack_app.command("figures")
def rack_figures(json_out: bool = json_flag()) -> None:
    """The power figures set over the defaults."""
    with client() as c:
        items = c.request("GET", "/power-figures")["items"]
    if json_out:
        print_json(items)
        return
    print_table(
        ("KIND", "NAME", "BOARD_W", "BASE_W"),
        [(i["kind"], i["name"], i["board_w"], i["base_w"]) for i in items],
    )
