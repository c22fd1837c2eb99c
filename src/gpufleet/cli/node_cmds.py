"""Node commands: ``gpufleet nodes`` (anyone, like sinfo); for operators and admins a
node's credentials (``gpufleet node register|join-token|credentials|revoke``) and maintenance
(``gpufleet node cordon|uncordon|drain|rollout|events``) and MIG layouts (``gpufleet node mig``).

A driver upgrade rolling through the fleet, two nodes at a time::

    gpufleet node drain --all --max-unavailable 2 --grace 10m --reason "driver 550"
    gpufleet node rollout            # progress: which nodes are drained and waiting for you
    # upgrade a drained node, then put it back; the rollout drains the next one:
    gpufleet node uncordon NODE

Slicing GPU 3 of n1 with MIG (the agent applies it once no job runs there), and back::

    gpufleet node mig n1 --gpu 3 --layout 2g.20gb,2g.20gb,3g.40gb --wait
    gpufleet node mig n1 --gpu 3 --whole
    gpufleet node share n1 --gpu 3          # GPU shares (--gpu-fraction) under MPS
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli import words
from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.apps import node_app
from gpufleet.cli.options import flag, json_flag

if TYPE_CHECKING:
    from gpufleet.api.nodes import GpuOut


def _node_line(n: dict[str, Any]) -> str:
    state = "cordoned" if n["cordoned"] else "schedulable"
    if n.get("draining"):
        state = "draining" if n["gpus_used"] else "drained"
    bad = [f"gpu{g['index']}" for g in n["gpus"] if g.get("cordoned")]
    extra = f"; cordoned GPUs: {','.join(bad)}" if bad else ""
    return f"node {n['name']}: {state}, {words.count(n['gpus_used'], 'GPU')} in use{extra}"


def _mig_text(g: GpuOut) -> str:
    """A GPU's MIG state for ``gpufleet nodes NODE``: its slices, the layout asked for and
    not yet applied, and why the last one failed; "" for a GPU not in MIG mode."""
    parts = []
    if g.mig_enabled:
        parts.append(f"mig=[{','.join(m.profile for m in g.mig_instances)}]")
    if g.mig_pending is not None:
        parts.append(f"mig-pending=[{','.join(g.mig_pending)}]" if g.mig_pending else "mig-pending=whole")
    if g.mig_error:
        parts.append(f"mig-error={g.mig_error!r}")
    if g.shared:
        parts.append("shared")
    return "".join(f" {p}" for p in parts)


def nodes(
    name: str | None = typer.Argument(None, help="Show one node in detail."),
    pool: str | None = typer.Option(None, "--pool", "-p"),
    json_out: bool = json_flag(),
) -> None:
    """Nodes and their GPUs, like sinfo."""
    with client() as c:  # the server's JSON, printed: no pydantic for the listing (~100 ms)
        if name:
            items = [c.request("GET", f"/nodes/{name}")]
        else:
            items = c.pages("/nodes", {} if pool is None else {"pool": pool})
    if json_out:
        print_json(items)
        return
    print_table(
        ("NODE", "POOL", "STATE", "FREE", "USED", "TOTAL", "MODEL"),
        [
            (
                n["name"],
                n["pool"],
                n["state"]
                + (",cordoned" if n["cordoned"] else "")
                + (",warning" if n.get("warning") else ""),
                n["gpus_free"],
                n["gpus_used"],
                n["gpus_total"],
                n["model"],
            )
            for n in items
        ],
    )
    if name and items[0].get("warning"):
        typer.echo(f"  warning: {items[0]['warning']}")
    if name:
        from gpufleet.api.nodes import NodeOut  # one node's GPUs in detail: the model reads MIG

        for g in NodeOut.model_validate(items[0]).gpus:
            typer.echo(
                f"  gpu{g.index} {g.model} {g.uuid} nvlink={g.nvlink_domain} "
                f"{'ok' if g.healthy else 'UNHEALTHY'} job={g.job_id or '-'}{_mig_text(g)}"
            )


def status(json_out: bool = json_flag()) -> None:
    """The servers and their leader: which server runs the loops, its epoch (the fencing
    token, raised at every change of leader) and the age of its lease."""
    with client() as c:
        got = c.request("GET", "/fleet/servers")
    if json_out:
        print_json(got)
        return
    if got["mode"] == "single":
        typer.echo(f"one server (SQLite): {got['me']}, it runs the loops")
        return
    leader = got["leader"] or "NONE (no server holds the lease: the loops are stopped)"
    age = got["lease_age_s"]
    typer.echo(
        f"leader: {leader}  epoch {got['epoch']}"
        + ("" if age is None else f"  lease renewed {age:.1f}s ago")
        + f"  (answered by {got['me']})"
    )
    print_table(
        ("SERVER", "STATE", "ROLE", "SEEN", "VERSION"),
        [
            (
                s["id"],
                "up" if s["up"] else "down",
                "leader" if s["leader"] else "-",
                f"{s['seen_s_ago']:.1f}s ago",
                s["version"],
            )
            for s in got["servers"]
        ],
    )


@node_app.command("register")
def register(
    node: str = typer.Argument(..., help="The node's name (its agent's --name)."),
    pool: str = typer.Option(
        ..., "--pool", "-p", help="Its pool, e.g. a CPU-only pool (gpufleet admin create-pool)."
    ),
    leaf: str = typer.Option("leaf-0", "--leaf", help="Its leaf switch (placement keeps wide jobs in one)."),
    rack: str = typer.Option("rack-0", "--rack"),
) -> None:
    """Register a new node in a pool before its agent first syncs (a node that registers
    itself goes to pool default). Its agent reports its GPUs, CPUs and memory."""
    from gpufleet.client import ClientError

    with client() as c:
        try:
            have = c.node(node)
        except ClientError as exc:
            if exc.status != 404:
                raise
        else:
            raise fail(f"node {node} exists already (pool {have.pool})", BAD_INPUT)
        n = c.put_node(node, {"pool": pool, "leaf": leaf, "rack": rack})
    typer.echo(f"node {n.name} registered in pool {n.pool}")


@node_app.command("join-token")
def join_token(
    node: str | None = typer.Option(None, "--node", help="Bind to this node (default: first to sync)."),
    ttl: str = typer.Option(
        "1h", "--ttl", help="It buys the node's certificate once, within this time (30m, 2h, 7d)."
    ),
) -> None:
    """Create a node credential for `gpufleet agent --token-file` (shown once). With TLS it
    buys the node's certificate once, before --ttl runs out; without TLS the agent syncs
    with it for the node's life (`gpufleet node revoke` ends it)."""
    from gpufleet.timefmt import parse_duration

    try:
        ttl_s = parse_duration(ttl)
    except ValueError as exc:
        raise fail(f"--ttl: {exc}", BAD_INPUT) from None
    if ttl_s <= 0:
        raise fail("--ttl: must be longer than 0", BAD_INPUT)
    with client() as c:
        made = c.request("POST", "/nodes/join-tokens", json={"node": node, "ttl": ttl_s})
    typer.echo(made["token"])


def _credential_state(it: dict[str, Any], now: float) -> str:
    """revoked, used (a join token that bought its certificate), expired (one that can
    no longer buy it), unbound (no node yet) or active."""
    if it["revoked_at"]:
        return "revoked"
    if it.get("used_at"):
        return "used"
    if it["kind"] == "join-token" and it.get("expires_at") and it["expires_at"] <= now:
        return "expired"
    return "unbound" if it["node"] is None else "active"


@node_app.command("credentials")
def credentials(
    node: str | None = typer.Option(None, "--node", help="Only this node's."),
    as_json: bool = json_flag(),
) -> None:
    """List node join tokens and certificates (never the secrets: a token's last
    characters, a certificate's serial)."""
    with client() as c:
        items = [it.model_dump() for it in c.node_credentials(node=node)]
    if as_json:
        print_json(items)
        return
    typer.echo(f"{'KIND':<11} {'ID':>5} {'NODE':<24} {'HINT/SERIAL':<40} {'EXPIRES':<16} STATE")
    now = time.time()
    for it in items:
        until = it["not_after"] or it.get("expires_at")
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(until)) if until else "-"
        state = _credential_state(it, now)
        typer.echo(
            f"{it['kind']:<11} {it['id']:>5} {it['node'] or '-':<24} {it['hint']:<40} {expires:<16} {state}"
        )


@node_app.command("revoke")
def revoke(
    node: str = typer.Argument(..., help="The node whose join tokens and certificates to revoke."),
) -> None:
    """Revoke every credential of a node: its next sync is refused (re-admit it with a
    new join token)."""
    with client() as c:
        got = c.request("POST", f"/nodes/{node}/revoke")
    typer.echo(
        f"revoked {words.count(got['join_tokens'], 'join token')} and "
        f"{words.count(got['certificates'], 'certificate')} of {node}"
    )


@node_app.command("cordon")
def cordon(
    node: str = typer.Argument(...),
    gpu: int | None = typer.Option(None, "--gpu", min=0, help="Only this GPU index."),
    reason: str = typer.Option("", "--reason"),
) -> None:
    """Take a node (or one GPU) out of scheduling; running jobs stay."""
    with client() as c:
        n = c.request("POST", f"/nodes/{node}/cordon", json={"gpu": gpu, "reason": reason})
    typer.echo(_node_line(n))


@node_app.command("uncordon")
def uncordon(
    node: str = typer.Argument(...),
    gpu: int | None = typer.Option(None, "--gpu", min=0, help="Only this GPU index."),
) -> None:
    """Put a node (or GPU) back in service; in a rollout, the node is then done."""
    with client() as c:
        n = c.request("POST", f"/nodes/{node}/uncordon", json={"gpu": gpu})
    typer.echo(_node_line(n))


@node_app.command("label", context_settings={"ignore_unknown_options": True})
def label(
    node: str = typer.Argument(...),
    changes: list[str] = typer.Argument(
        ..., help="+FEATURE adds it, -FEATURE takes it off (a bare word adds)."
    ),
) -> None:
    """Add or take off a node's features (operators), which jobs' --constraint matches
    as they match what the node's agent reports (gpufleet agent --features)."""
    add = [c.removeprefix("+") for c in changes if not c.startswith("-")]
    remove = [c[1:] for c in changes if c.startswith("-")]
    with client() as c:
        n = c.request("POST", f"/nodes/{node}/labels", json={"add": add, "remove": remove})
    labels, features = ",".join(n["labels"]) or "-", ",".join(n["features"]) or "-"
    typer.echo(f"{n['name']}: labels {labels}; features (its agent's) {features}")


WAIT_POLL_S = 0.5
"""How often ``--wait`` reads the node."""


def _wait_timeout(text: str) -> float:
    from gpufleet.timefmt import parse_duration

    try:
        secs = parse_duration(text)
    except ValueError as exc:
        raise fail(f"--timeout: {exc}", BAD_INPUT) from None
    if not 0 < secs <= 86_400:
        raise fail("--timeout: between 1 second and 1 day", BAD_INPUT)
    return secs


def _gpu_of(n: dict[str, Any], index: int) -> dict[str, Any]:
    found: dict[str, Any] = next((g for g in n["gpus"] if g["index"] == index), {})
    return found


def mig_state(g: dict[str, Any], profiles: list[str]) -> str | None:
    """Where a layout asked for GPU ``g`` (a ``GpuOut`` as JSON) stands: None while it is
    pending; "applied" once the node's agent reported it in effect (no layout pending, its
    instances the profiles asked: none and MIG mode off for the whole GPU); "failed" when
    the node refused it (``mig_error``); "replaced" when another layout was asked since."""
    pending = g.get("mig_pending")
    if pending is not None:
        return None if list(pending) == profiles else "replaced"
    if g.get("mig_error"):
        return "failed"
    have = sorted(m["profile"] for m in g.get("mig_instances") or ())
    if profiles:
        return "applied" if have == sorted(profiles) else "replaced"
    return "replaced" if have or g.get("mig_enabled") else "applied"


@node_app.command("mig")
def mig_layout(
    node: str = typer.Argument(...),
    gpu: int = typer.Option(..., "--gpu", min=0, help="The GPU index."),
    layout: str | None = typer.Option(
        None, "--layout", help="MIG profiles for the GPU's model, e.g. 2g.20gb,2g.20gb,3g.40gb."
    ),
    whole: bool = flag("--whole", help="Make the GPU whole again: no MIG instances, MIG mode off."),
    wait: bool = flag("--wait", help="Return once the node's agent has applied it (or refused it)."),
    timeout: str = typer.Option("10m", "--timeout", help="With --wait: give up after this long (30s, 10m)."),
    json_out: bool = json_flag("the line"),
) -> None:
    """Slice a GPU with MIG, or make it whole again. The GPU is cordoned until its agent
    has applied the layout, which it does once no job runs there; jobs asking for the
    layout's slices wait for it meanwhile. --wait returns once it is in effect."""
    if (layout is None) == (not whole):
        raise fail("give either --layout PROFILES or --whole", BAD_INPUT)
    limit = _wait_timeout(timeout) if wait else 0.0
    profiles: list[str] | None = None
    if layout is not None:
        try:
            from gpufleet.mig import parse_layout  # the MIG table: only for this command

            profiles = parse_layout(layout)
        except ValueError as exc:
            raise fail(str(exc), BAD_INPUT) from None
    asked = "whole GPU" if profiles is None else f"MIG layout {','.join(profiles)}"
    with client() as c:
        n = c.request("PUT", f"/nodes/{node}/gpus/{gpu}/mig", json={"layout": profiles, "whole": whole})
        state = mig_state(_gpu_of(n, gpu), profiles or [])
        deadline = time.monotonic() + limit
        while wait and state is None and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_S)
            n = c.request("GET", f"/nodes/{node}")
            state = mig_state(_gpu_of(n, gpu), profiles or [])
    if json_out:
        print_json(n)
    g = _gpu_of(n, gpu)
    where = f"node {node} GPU {gpu}"
    if state == "failed":
        raise fail(f"{where}: {asked} failed on the node: {g.get('mig_error')} (the GPU stays cordoned)")
    if state == "replaced":
        raise fail(f"{where}: another MIG layout was asked since {asked}: gpufleet nodes {node} shows it")
    if wait and state is None:
        held = f" (job {g['job_id']} holds it)" if g.get("job_id") else ""
        raise fail(
            f"{where}: {asked} still pending after {timeout}{held}: the node's agent applies it once no "
            f"job holds the GPU; it stays asked (gpufleet nodes {node} shows it)"
        )
    if json_out:
        return
    if state == "applied":
        typer.echo(f"{where}: {asked} in effect{_mig_text_of(g)}")
    else:
        typer.echo(
            f"{where}: {asked} asked, pending: the GPU takes no new job until its agent applies it "
            "(once no job holds it); jobs asking for its slices wait for it (--wait waits too)"
        )


def _mig_text_of(g: dict[str, Any]) -> str:
    from gpufleet.api.nodes import GpuOut

    return _mig_text(GpuOut.model_validate(g))


@node_app.command("share")
def share_gpu(
    node: str = typer.Argument(...),
    gpu: list[int] = typer.Option(..., "--gpu", min=0, help="The GPU index (again for several)."),
    off: bool = flag("--off", help="Make the GPU whole again (no job may hold a share of it)."),
    wait: bool = flag("--wait", help="Return once the node's agent has synced since, and is Ready."),
    timeout: str = typer.Option("2m", "--timeout", help="With --wait: give up after this long (30s, 2m)."),
    json_out: bool = json_flag("the node"),
) -> None:
    """Share a GPU: it takes jobs asking for part of one (``--gpu-fraction``,
    ``--gpu-memory``), run under MPS with their compute and memory limits, and no longer
    whole-GPU jobs. Refused while a job holds the GPU: cordon it and wait.

    The switch is the server's: a job submitted once this returns is judged against it.
    --wait also waits for the node's agent to sync since (a share starts nowhere else)."""
    limit = _wait_timeout(timeout) if wait else 0.0
    n: dict[str, Any] = {}
    with client() as c:
        for g in gpu:
            n = c.request("PUT", f"/nodes/{node}/gpus/{g}/share", json={"shared": not off})
        seen = n.get("last_seen") or 0.0
        deadline = time.monotonic() + limit
        while wait and not _synced_since(n, seen) and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_S)
            n = c.request("GET", f"/nodes/{node}")
    gpus = ",".join(map(str, gpu))
    if wait and not _synced_since(n, seen):
        raise fail(
            f"node {node} GPU {gpus}: {'whole again' if off else 'shared'} on the server, but the node "
            f"({n.get('state')}) has not synced in {timeout}: its jobs start once its agent is back"
        )
    if json_out:
        print_json(n)
        return
    what = "whole again" if off else "shared (GPU shares only, no whole-GPU jobs)"
    typer.echo(f"node {node} GPU {gpus}: {what}" + ("; its agent has synced since" if wait else ""))


def _synced_since(n: dict[str, Any], seen: float) -> bool:
    return n.get("state") == "Ready" and (n.get("last_seen") or 0.0) > seen


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
        raise fail("give NODE(s) or --all", BAD_INPUT)
    with client() as c:
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
    json_out: bool = json_flag("the summary"),
) -> None:
    """Progress of a rolling drain."""
    with client() as c:
        if cancel:
            rid = rollout_id if rollout_id is not None else c.request("GET", "/rollouts/current")["id"]
            r = c.request("POST", f"/rollouts/{rid}/cancel")
        else:
            r = c.request("GET", "/rollouts/current" if rollout_id is None else f"/rollouts/{rollout_id}")
    if json_out:
        print_json(r)
        return
    _rollout_lines(r)


@node_app.command("events")
def events(
    node: str | None = typer.Argument(None),
    alerts: bool = flag("--alerts", help="Only critical and warning events."),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    json_out: bool = json_flag("a line per event"),
) -> None:
    """GPU cordons, lost nodes, drains: the fleet's health and maintenance log."""
    params: dict[str, Any] = {"limit": limit, "alerts": alerts}
    if node:
        params["node"] = node
    with client() as c:
        rows = c.request("GET", "/fleet/events", params=params)
    if json_out:
        print_json(rows)
        return
    for e in rows:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        where = e["node"] + ("" if e["gpu_index"] is None else f"/gpu{e['gpu_index']}")
        typer.echo(f"{at}  {e['severity']:<8} {e['kind']:<14} {where}: {e['reason']}")


__all__ = [
    "cordon",
    "credentials",
    "drain",
    "events",
    "join_token",
    "mig_layout",
    "nodes",
    "register",
    "revoke",
    "rollout",
    "share_gpu",
    "status",
    "uncordon",
]
