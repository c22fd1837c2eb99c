"""Node maintenance commands (operators and admins): ``gpufleet node cordon|uncordon|
drain|rollout|events``.

A driver upgrade rolling through the fleet, two nodes at a time::

    gpufleet node drain --all --max-unavailable 2 --grace 10m --reason "driver 550"
    gpufleet node rollout            # progress: which nodes are drained and waiting for you
    # upgrade a drained node, then put it back; the rollout drains the next one:
    gpufleet node uncordon NODE
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from gpufleet.cli.agent_cmds import node_app
from gpufleet.cli.options import flag
from gpufleet.client import ClientError, GpufleetClient


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"gpufleet: error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def _client() -> Iterator[GpufleetClient]:
    try:
        with GpufleetClient.from_env() as c:
            yield c
    except ClientError as exc:
        raise _fail(exc.message, 2 if exc.status in (400, 422) else 1) from None


def _node_line(n: dict[str, Any]) -> str:
    state = "cordoned" if n["cordoned"] else "schedulable"
    if n.get("draining"):
        state = "draining" if n["gpus_used"] else "drained"
    bad = [f"gpu{g['index']}" for g in n["gpus"] if g.get("cordoned")]
    extra = f"; cordoned GPUs: {','.join(bad)}" if bad else ""
    return f"node {n['name']}: {state}, {n['gpus_used']} GPU(s) in use{extra}"


@node_app.command("cordon")
def cordon(
    node: str = typer.Argument(...),
    gpu: int | None = typer.Option(None, "--gpu", min=0, help="Only this GPU index."),
    reason: str = typer.Option("", "--reason"),
) -> None:
    """Take a node (or one GPU) out of scheduling; running jobs stay."""
    with _client() as c:
        n = c.request("POST", f"/nodes/{node}/cordon", json={"gpu": gpu, "reason": reason})
    typer.echo(_node_line(n))


@node_app.command("uncordon")
def uncordon(
    node: str = typer.Argument(...),
    gpu: int | None = typer.Option(None, "--gpu", min=0, help="Only this GPU index."),
) -> None:
    """Put a node (or GPU) back in service; in a rollout, the node is then done."""
    with _client() as c:
        n = c.request("POST", f"/nodes/{node}/uncordon", json={"gpu": gpu})
    typer.echo(_node_line(n))


def _rollout_lines(r: dict[str, Any]) -> None:
    counts = r["counts"]
    total = sum(counts.values())
    typer.echo(
        f"rollout {r['id']} ({r['state']}): {counts['done']}/{total} done, {counts['draining']} draining, "
        f"{counts['drained']} drained (waiting for uncordon), {counts['waiting']} waiting; "
        f"max unavailable {r['max_unavailable']}"
    )
    for m in r["nodes"]:
        if m["state"] in ("draining", "drained"):
            typer.echo(f"  {m['node']}: {m['state']}")


@node_app.command("drain")
def drain(
    nodes: list[str] = typer.Argument(None, help="Node(s); several, or --all, start a rollout."),
    all_nodes: bool = flag("--all", help="Roll a drain through every node (of --pool)."),
    pool: str | None = typer.Option(None, "--pool", "-p"),
    max_unavailable: int = typer.Option(1, "--max-unavailable", min=1, help="Nodes drained at once."),
    grace: str = typer.Option("10m", "--grace", help="Running jobs may finish this long, then requeue."),
    requeue: bool = flag("--requeue", help="Requeue running jobs at once, not after --grace."),
    reason: str = typer.Option("", "--reason"),
    wait: bool = flag("--wait", help="One node: wait until it runs no job."),
) -> None:
    """Cordon and empty a node, or roll a drain through many (rolling maintenance)."""
    nodes = nodes or []
    if all_nodes == bool(nodes):
        raise _fail("give NODE(s) or --all", 2)
    with _client() as c:
        if len(nodes) == 1 and not all_nodes:
            body = {"grace": grace, "requeue": requeue, "reason": reason}
            n = c.request("POST", f"/nodes/{nodes[0]}/drain", json=body)
            while wait and n["gpus_used"]:
                time.sleep(1.0)
                n = c.request("GET", f"/nodes/{nodes[0]}")
            typer.echo(_node_line(n))
            return
        spec = {
            "nodes": nodes,
            "all": all_nodes,
            "pool": pool,
            "max_unavailable": max_unavailable,
            "grace": grace,
            "requeue": requeue,
            "reason": reason,
        }
        _rollout_lines(c.request("POST", "/rollouts", json=spec))


@node_app.command("rollout")
def rollout(
    rollout_id: int | None = typer.Argument(None, help="Default: the active (else latest) rollout."),
    cancel: bool = flag("--cancel", help="Cancel the rollout: start no more drains."),
) -> None:
    """Progress of a rolling drain."""
    with _client() as c:
        if cancel:
            rid = rollout_id if rollout_id is not None else c.request("GET", "/rollouts/current")["id"]
            r = c.request("POST", f"/rollouts/{rid}/cancel")
        else:
            r = c.request("GET", "/rollouts/current" if rollout_id is None else f"/rollouts/{rollout_id}")
    _rollout_lines(r)


@node_app.command("events")
def events(
    node: str | None = typer.Argument(None),
    alerts: bool = flag("--alerts", help="Only critical and warning events."),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
) -> None:
    """GPU cordons, lost nodes, drains: the fleet's health and maintenance log."""
    params: dict[str, Any] = {"limit": limit, "alerts": alerts}
    if node:
        params["node"] = node
    with _client() as c:
        rows = c.request("GET", "/fleet/events", params=params)
    for e in rows:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        where = e["node"] + ("" if e["gpu_index"] is None else f"/gpu{e['gpu_index']}")
        typer.echo(f"{at}  {e['severity']:<8} {e['kind']:<14} {where}: {e['reason']}")


__all__ = ["cordon", "drain", "events", "rollout", "uncordon"]
