"""``gpufleet admin``: users, teams, quotas, pools and the audit log (admins). Prices and
budgets are in ``chargeback_cmds``.

``admin create-user --database-url`` writes the database directly (the way back in when
every admin token lapsed): it imports the server then, the other commands never do.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.apps import admin_app
from gpufleet.cli.options import flag, json_flag
from gpufleet.timefmt import parse_duration


@admin_app.command("create-user")
def create_user(
    name: str = typer.Argument(...),
    team: list[str] = typer.Option([], "--team", help="Team(s) to join; repeat."),
    role: str = typer.Option("user", "--role", help="admin, operator or user."),
    database_url: str | None = typer.Option(
        None, "--database-url", help="Write the database directly instead of calling the API."
    ),
    token_secret_file: Path | None = typer.Option(
        None,
        "--token-secret-file",
        envvar="GPUFLEET_TOKEN_SECRET_FILE",
        help="With --database-url: the server's token secret (as gpufleet server takes it).",
    ),
) -> None:
    """Create a user and print their token (shown only once). With --database-url, on
    the database host: also the way back in when every admin token lapsed."""
    if role not in ("admin", "operator", "user"):
        raise fail(f"--role: {role!r} is not one of admin, operator, user", BAD_INPUT)
    if database_url is not None:
        from gpufleet.server.direct import create_user_direct
        from gpufleet.server.problems import Failure

        made = create_user_direct(
            database_url=database_url, name=name, role=role, teams=team, secret_file=token_secret_file
        )
        if isinstance(made, Failure):
            raise fail(f"cannot create user: {made.detail}")
        typer.echo(made)
        return
    with client() as c:
        typer.echo(c.create_user(name, role=role, teams=team).token)


@admin_app.command("create-team")
def create_team(name: str = typer.Argument(...)) -> None:
    """Create a team."""
    with client() as c:
        typer.echo(f"team {c.create_team(name).name} created")


@admin_app.command("add-member")
def add_member(team: str = typer.Argument(...), user: str = typer.Argument(...)) -> None:
    """Add a user to a team."""
    with client() as c:
        t = c.add_member(team, user)
    typer.echo(f"team {t.name}: {', '.join(t.members)}")


@admin_app.command("set-quota")
def set_quota(
    team: str = typer.Argument(...),
    gpus: int = typer.Option(..., "--gpus", min=0, help="Nominal share (fair-share weight)."),
    limit: int | None = typer.Option(None, "--limit", min=0, help="Hard cap (default: none)."),
) -> None:
    """Set a team's quota."""
    with client() as c:
        t = c.set_quota(team, gpus=gpus, limit=limit)
    typer.echo(f"team {t.name}: {t.quota_gpus} GPUs nominal, limit {t.quota_limit or 'none'}")


@admin_app.command("create-pool")
def create_pool(
    name: str = typer.Argument(...),
    cpu_only: bool = flag("--cpu-only", help="A pool for 0-GPU jobs."),
    description: str = typer.Option("", "--description"),
    default: bool = flag(
        "--default", help="Jobs that name no pool (-p) go here (Slurm's Default=YES; replaces the last)."
    ),
) -> None:
    """Create a pool (partition)."""
    with client() as c:
        p = c.create_pool(name, gpu=not cpu_only, description=description, default=default)
    kind = "GPU" if p.gpu else "CPU-only"
    typer.echo(f"pool {p.name} created ({kind}{', the default pool' if p.default else ''})")


@admin_app.command("default-pool")
def default_pool(name: str = typer.Argument(..., help="The pool jobs without -p go to.")) -> None:
    """Make an existing pool the default (Slurm's Default=YES): jobs that name no pool go
    there. Without one marked, the pool named default is."""
    with client() as c:
        p = c.update_pool(name, default=True)
    typer.echo(f"pool {p.name} is the default pool")


@admin_app.command("delete-pool")
def delete_pool(name: str = typer.Argument(...)) -> None:
    """Delete an unused pool."""
    with client() as c:
        typer.echo(f"pool {c.delete_pool(name).name} deleted")


@admin_app.command("users")
def list_users(json_out: bool = json_flag()) -> None:
    """List users."""
    with client() as c:
        items = c.users()
    if json_out:
        print_json([u.model_dump() for u in items])
    else:
        rows = [(u.name, u.role, ",".join(u.teams), u.default_team or "-") for u in items]
        print_table(("USER", "ROLE", "TEAMS", "DEFAULT TEAM"), rows)


@admin_app.command("teams")
def list_teams(json_out: bool = json_flag()) -> None:
    """List teams, quotas and budgets."""
    with client() as c:
        items = c.teams()
    if json_out:
        print_json([t.model_dump() for t in items])
    else:
        print_table(
            ("TEAM", "QUOTA", "LIMIT", "BUDGET SOFT", "HARD", "SPENT (MONTH)", "MEMBERS"),
            [
                (
                    t.name,
                    t.quota_gpus,
                    t.quota_limit,
                    t.budget_soft,
                    t.budget_hard,
                    None if t.month_cost is None else f"{t.month_cost:.2f}",
                    ",".join(t.members),
                )
                for t in items
            ],
        )


@admin_app.command("pools")
def list_pools(json_out: bool = json_flag()) -> None:
    """List pools."""
    with client() as c:
        items = c.pools()
    if json_out:
        print_json([p.model_dump() for p in items])
    else:
        print_table(
            ("POOL", "KIND", "NODES", "DESCRIPTION"),
            [
                (f"{p.name}*" if p.default else p.name, "gpu" if p.gpu else "cpu", p.nodes, p.description)
                for p in items
            ],
        )


qos_app = typer.Typer(help="QOS: priority, per-user limits, preemptability (Slurm's sacctmgr qos).")
admin_app.add_typer(qos_app, name="qos")


@qos_app.command("create")
def qos_create(
    name: str = typer.Argument(...),
    priority: int = typer.Option(0, "--priority", min=-1000, max=1000, help="Added to its jobs' priority."),
    max_gpus_per_user: int | None = typer.Option(
        None, "--max-gpus-per-user", min=0, help="GPUs one user's running jobs of it may hold."
    ),
    max_jobs_per_user: int | None = typer.Option(
        None, "--max-jobs-per-user", min=0, help="Jobs of it one user may run at once."
    ),
    preemptable: bool = typer.Option(
        True, "--preemptable/--no-preemptable", help="Whether its jobs may be preempted."
    ),
    default: bool = flag("--default", help="Jobs without --qos get it (replaces the last default)."),
    description: str = typer.Option("", "--description"),
) -> None:
    """Create a QOS, or replace the one of that name (say it whole). Jobs name it with
    --qos; a job over a per-user limit waits (QOSMaxGRESPerUser, QOSMaxJobsPerUserLimit)."""
    body = {
        "name": name,
        "priority": priority,
        "max_gpus_per_user": max_gpus_per_user,
        "max_jobs_per_user": max_jobs_per_user,
        "preemptable": preemptable,
        "default": default,
        "description": description,
    }
    with client() as c:
        q = c.request("PUT", f"/qos/{name}", json=body)
    typer.echo(f"qos {q['name']}: {_qos_terms(q)}")


def _qos_terms(q: dict[str, object]) -> str:
    gpus, jobs = q["max_gpus_per_user"], q["max_jobs_per_user"]
    return (
        f"priority {q['priority']}, max {'-' if gpus is None else gpus} GPUs and "
        f"{'-' if jobs is None else jobs} jobs per user, "
        f"{'preemptable' if q['preemptable'] else 'not preemptable'}{', the default' if q['default'] else ''}"
    )


@qos_app.command("list")
def qos_list(json_out: bool = json_flag()) -> None:
    """Every QOS (anyone may list them: they say why a job waits)."""
    with client() as c:
        items = c.request("GET", "/qos")["items"]
    if json_out:
        print_json(items)
        return
    print_table(
        ("QOS", "PRIORITY", "MAXGPUS/USER", "MAXJOBS/USER", "PREEMPT", "DEFAULT"),
        [
            (
                q["name"],
                q["priority"],
                "-" if q["max_gpus_per_user"] is None else q["max_gpus_per_user"],
                "-" if q["max_jobs_per_user"] is None else q["max_jobs_per_user"],
                "yes" if q["preemptable"] else "no",
                "*" if q["default"] else "",
            )
            for q in items
        ],
    )


@qos_app.command("delete")
def qos_delete(name: str = typer.Argument(...)) -> None:
    """Delete a QOS; its jobs keep running, without its limits."""
    with client() as c:
        typer.echo(f"qos {c.request('DELETE', f'/qos/{name}')['name']} deleted")


license_app = typer.Typer(help="Licenses jobs ask for with -L (Slurm's Licenses=NAME:COUNT).")
admin_app.add_typer(license_app, name="license")


@license_app.command("set")
def license_set(
    name: str = typer.Argument(...),
    count: int = typer.Argument(..., min=0, help="How many there are (0: none now)."),
) -> None:
    """Declare a license and how many there are (operators). Jobs name it with -L NAME[:N]
    and wait (reason Licenses) while running jobs hold them all."""
    with client() as c:
        got = c.request("PUT", f"/licenses/{name}", json={"count": count})
    typer.echo(f"license {got['name']}: {got['count']} ({got['used']} in use)")


@license_app.command("list")
def license_list(json_out: bool = json_flag()) -> None:
    """Declared licenses and how many running jobs hold."""
    with client() as c:
        items = c.request("GET", "/licenses")["items"]
    if json_out:
        print_json(items)
        return
    print_table(
        ("LICENSE", "TOTAL", "USED", "FREE"),
        [(i["name"], i["count"], i["used"], i["count"] - i["used"]) for i in items],
    )


@license_app.command("delete")
def license_delete(name: str = typer.Argument(...)) -> None:
    """Forget a license (jobs that name it are refused from then on)."""
    with client() as c:
        typer.echo(f"license {c.request('DELETE', f'/licenses/{name}')['name']} deleted")


@admin_app.command("audit")
def audit(
    user: str | None = typer.Option(None, "--user", help="Only this user's requests."),
    since: str | None = typer.Option(None, "--since", help="Only this recent, e.g. 1h or 1d."),
    limit: int = typer.Option(100, "--limit", min=1, max=100_000, help="At most this many rows."),
    json_out: bool = json_flag(),
) -> None:
    """The audit log: every mutating API request (who, from where, what, outcome), newest
    first. Admins only; agents' syncs are not in it."""
    try:
        start = None if since is None else time.time() - parse_duration(since)
    except ValueError as exc:
        raise fail(f"--since: {exc}", BAD_INPUT) from None
    with client() as c:
        rows = c.audit(user=user, since=start, limit=limit)
    if json_out:
        print_json([r.model_dump() for r in rows])
        return
    print_table(
        ("TIME", "USER", "ROLE", "ADDRESS", "REQUEST", "OBJECT", "STATUS"),
        [
            (
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.at)),
                r.actor,
                r.role,
                r.address,
                f"{r.method} {r.path}",
                r.object,
                r.status,
            )
            for r in rows
        ],
    )


__all__ = [
    "add_member",
    "audit",
    "create_pool",
    "create_team",
    "create_user",
    "default_pool",
    "delete_pool",
    "license_delete",
    "license_list",
    "license_set",
    "list_pools",
    "list_teams",
    "list_users",
    "qos_create",
    "qos_delete",
    "qos_list",
    "set_quota",
]
