"""``gpufleet upgrade start|status|pause|resume|abort``: rolling driver upgrades that
verify (operators; the server's ``services/upgrades.py``).

Fifty nodes, two at a time, each upgraded by the hook ``driver`` its own agent was
started with (``gpufleet agent --upgrade-hook driver=/usr/local/sbin/upgrade-driver``)::

    gpufleet upgrade start --nodes node-[000-049] --expect-driver 550.54.15 \\
        --command driver --max-unavailable 2 --drain-timeout 1h
    gpufleet upgrade status          # per node: draining, upgrading, verifying, done, failed
    gpufleet upgrade resume          # after fixing what stopped it (or --skip NODE)

Without ``--command`` each drained node waits for the operator to upgrade it by hand;
``upgrade resume`` (or ``node uncordon NODE``) then verifies it and goes on.
"""

from __future__ import annotations

from typing import Any

import typer

from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.options import json_flag

upgrade_app = typer.Typer(help="Rolling driver upgrades that verify (operators).", no_args_is_help=True)


def _nodes(text: str) -> list[str]:
    from gpufleet.slurm.hostlist import expand

    try:
        names = expand(text)
    except ValueError as exc:
        raise fail(f"--nodes: {exc}", BAD_INPUT) from None
    if not names:
        raise fail("--nodes: no node named", BAD_INPUT)
    return names


def _id(c: Any, rollout: int | None) -> int:
    return rollout if rollout is not None else int(c.request("GET", "/upgrades/current")["id"])


def _show(r: dict[str, Any], *, as_json: bool, every: bool = False) -> None:
    if as_json:
        print_json(r)
        return
    counts = {k: v for k, v in r["counts"].items() if v}
    total = len(r["nodes"])
    how = f"hook {r['hook']}" if r.get("hook") else "by hand"
    typer.echo(
        f"upgrade {r['id']} ({r['state']}): driver {r['expect_driver']} ({how}), "
        f"{r['counts'].get('done', 0)}/{total} done, max unavailable {r['max_unavailable']}; "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
    )
    if r.get("pause_reason"):
        typer.echo(f"  paused: {r['pause_reason']}")
    rows = [
        (m["node"], m["state"], m.get("driver"), m.get("reason"))
        for m in r["nodes"]
        if every or m["state"] not in ("waiting", "done") or m.get("reason")
    ]
    if rows:
        print_table(("NODE", "STATE", "DRIVER", "REASON"), rows)


@upgrade_app.command("start")
def start(
    nodes: str = typer.Option(..., "--nodes", "-w", help="A hostlist: node-[000-049],gpu7 (in this order)."),
    expect_driver: str = typer.Option(..., "--expect-driver", help="The driver each node must report after."),
    command: str | None = typer.Option(
        None,
        "--command",
        help="The upgrade hook each node's agent runs (its --upgrade-hook NAME); none: you upgrade by hand.",
        show_default=False,
    ),
    max_unavailable: int = typer.Option(1, "--max-unavailable", min=1, help="Nodes out of service at once."),
    drain_timeout: str = typer.Option("1h", "--drain-timeout", help="Running jobs may finish this long."),
    reason: str = typer.Option("", "--reason"),
    as_json: bool = json_flag(),
) -> None:
    """Roll a driver upgrade through nodes: drain, upgrade, verify, uncordon, batch by batch."""
    body = {
        "nodes": _nodes(nodes),
        "expect_driver": expect_driver,
        "hook": command,
        "max_unavailable": max_unavailable,
        "drain_timeout": drain_timeout,
        "reason": reason,
    }
    with client() as c:
        r = c.request("POST", "/upgrades", json=body)
    _show(r, as_json=as_json)


@upgrade_app.command("status")
def status(
    rollout: int | None = typer.Argument(None, help="Its id (default: the open one, else the latest)."),
    every: bool = typer.Option(False, "--all", "-a", help="List every node, waiting and done ones too."),
    as_json: bool = json_flag(),
) -> None:
    """Where an upgrade stands: the count of nodes in each state, the nodes under way or
    with a reason (--all: every node), and why it paused."""
    with client() as c:
        path = "/upgrades/current" if rollout is None else f"/upgrades/{rollout}"
        r = c.request("GET", path)
    _show(r, as_json=as_json, every=every)


@upgrade_app.command("pause")
def pause(rollout: int | None = typer.Argument(None), as_json: bool = json_flag()) -> None:
    """Drain no new node; nodes under way finish their step."""
    with client() as c:
        r = c.request("POST", f"/upgrades/{_id(c, rollout)}/pause")
    _show(r, as_json=as_json)


@upgrade_app.command("resume")
def resume(
    rollout: int | None = typer.Argument(None),
    skip: list[str] = typer.Option([], "--skip", help="Leave this node out (a failed one stays cordoned)."),
    as_json: bool = json_flag(),
) -> None:
    """Go on: verify nodes upgraded by hand, try failed ones again, drain the next."""
    with client() as c:
        r = c.request("POST", f"/upgrades/{_id(c, rollout)}/resume", json={"skip": skip})
    _show(r, as_json=as_json)


@upgrade_app.command("abort")
def abort(rollout: int | None = typer.Argument(None), as_json: bool = json_flag()) -> None:
    """Stop for good: draining nodes back in service, nodes mid-upgrade left cordoned."""
    with client() as c:
        r = c.request("POST", f"/upgrades/{_id(c, rollout)}/abort")
    _show(r, as_json=as_json)
