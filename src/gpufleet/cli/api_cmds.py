"""The user, operator and admin commands that talk to a gpufleet server, plus
``gpufleet server`` and ``gpufleet db upgrade``.

Errors are one line on stderr: exit 2 for bad input (the server's 400/422, a bad
option), 1 for everything else (unreachable server, 401, 403, 404, 409).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli import jobview, sbatch
from gpufleet.cli.options import flag, json_flag
from gpufleet.client import ClientError, Connection, GpufleetClient, save_connection
from gpufleet.server.defaults import NODE_TIMEOUT_S, REQUEUE_AFTER_S
from gpufleet.server.health import DEFAULT_FATAL_XIDS
from gpufleet.timefmt import format_duration, parse_duration

jobs_app = typer.Typer(help="Jobs: list and show.", no_args_is_help=True)
admin_app = typer.Typer(help="Users, teams, quotas, pools (admins).", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
tokens_app = typer.Typer(help="Your API tokens.", no_args_is_help=True)

JSON_OPT = json_flag()


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"gpufleet: error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def _client() -> Iterator[GpufleetClient]:
    try:
        with GpufleetClient.from_env() as c:
            yield c
    except ClientError as exc:
        raise _fail(exc.message, 2 if exc.status in (400, 413, 422) else 1) from None


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _eta(at: float | None) -> str:
    if at is None:
        return "-"
    delta = at - time.time()
    return "now" if delta <= 1 else "in " + format_duration(delta)


# -- server side ----------------------------------------------------------------------------


def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    database_url: str | None = typer.Option(
        None, "--database-url", help="SQLAlchemy URL (default: SQLite in the user data dir)."
    ),
    policy: str = typer.Option("default", "--policy", help="Scheduling policy."),
    node_timeout: str = typer.Option(
        f"{NODE_TIMEOUT_S:g}s", "--node-timeout", help="A node unseen this long is NotReady."
    ),
    requeue_after: str = typer.Option(
        f"{REQUEUE_AFTER_S:g}s",
        "--requeue-after",
        help="NotReady this much longer: node lost, its jobs requeued.",
    ),
    gpu_max_temp: float = typer.Option(85.0, "--gpu-max-temp", help="Hotter (C) for --gpu-hot-for: cordon."),
    gpu_hot_for: str = typer.Option("30s", "--gpu-hot-for"),
    gpu_recover_after: str = typer.Option(
        "10m", "--gpu-recover-after", help="An overheat cordon lifts after this long at normal temperature."
    ),
    gpu_fatal_xids: str = typer.Option(
        ",".join(map(str, sorted(DEFAULT_FATAL_XIDS))), "--gpu-fatal-xids", help="XIDs that cordon a GPU."
    ),
    gpu_max_ecc_dbe: int = typer.Option(1, "--gpu-max-ecc-dbe", min=0, help="DBE errors; 0: off."),
    gpu_max_retired_pages: int = typer.Option(60, "--gpu-max-retired-pages", min=0, help="0: off."),
    alert_webhook: str | None = typer.Option(
        None, "--alert-webhook", help="POST built-in alerts here (Alertmanager webhook JSON)."
    ),
    queue_wait_alert: str = typer.Option("30m", "--queue-wait-alert", help="QueueWaitHigh threshold."),
    idle_release: str = typer.Option(
        "15m", "--idle-release", help="Release a started reservation no owner job used for this long."
    ),
    prices: Path | None = typer.Option(
        None, "--prices", help="Price schedule (JSON or .toml) to put in force at start."
    ),
    scheduler_thread: bool = flag(
        "--scheduler-thread",
        help="Run scheduling passes in a thread of the API process (default: a child process).",
    ),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Serve HTTPS with this certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="The certificate's key (PEM, 0600)."),
    ca_dir: Path | None = typer.Option(
        None,
        "--ca-dir",
        help="The cluster CA (gpufleet ca init): with --tls-cert, agents sync with node certificates.",
    ),
    insecure_http: bool = flag("--insecure-http", help="Allow plain HTTP on an address other than loopback."),
    rate_user: str = typer.Option(
        "30/10", "--rate-user", help="A user's requests: BURST/PER_SECOND (a token bucket), or off."
    ),
    rate_operator: str = typer.Option(
        "300/100", "--rate-operator", help="An operator's requests (as --rate-user)."
    ),
    rate_admin: str = typer.Option("300/100", "--rate-admin", help="An admin's requests (as --rate-user)."),
    auth_failures: str = typer.Option(
        "20/1m", "--auth-failures", help="Failed authentications per address: N/WINDOW, then 429; or off."
    ),
    node_lane: int = typer.Option(16, "--node-lane", min=1, help="Agent requests served at once."),
    admin_lane: int = typer.Option(8, "--admin-lane", min=1, help="Operator and admin requests at once."),
    user_lane: int = typer.Option(4, "--user-lane", min=1, help="User requests served at once."),
    max_pending_jobs: int = typer.Option(
        10_000, "--max-pending-jobs", min=0, help="Pending or held jobs per user (0: no cap)."
    ),
    max_reservations: int = typer.Option(
        100, "--max-reservations", min=0, help="Booked or active reservations per user (0: no cap)."
    ),
    max_tokens: int = typer.Option(50, "--max-tokens", min=0, help="Live API tokens per user (0: no cap)."),
    token_secret_file: Path | None = typer.Option(
        None,
        "--token-secret-file",
        envvar="GPUFLEET_TOKEN_SECRET_FILE",
        help="The key tokens are stored under (made, 0600, if missing). Default: GPUFLEET_TOKEN_SECRET, "
        "else DB.token-secret next to a SQLite DB or token-secret in the user data dir.",
    ),
    token_ttl: str = typer.Option("90d", "--token-ttl", help="API tokens expire after this."),
    session_ttl: str = typer.Option("12h", "--session-ttl", help="Web sign-ins expire after this."),
    audit_days: float = typer.Option(
        90.0, "--audit-days", min=0.0001, help="Keep audit rows this many days."
    ),
    metrics_public: bool = flag(
        "--metrics-public", help="Serve /metrics without a token (default: operators and admins)."
    ),
    team_cost_metrics: bool = flag(
        "--team-cost-metrics/--no-team-cost-metrics",
        default=True,
        help="Per-team cost and budget series in /metrics.",
    ),
) -> None:
    """Run the control plane (API under /v1, scheduling and node-lifecycle loops).

    Health rules cordon one GPU and requeue its job: temperature above --gpu-max-temp
    for --gpu-hot-for, an XID in --gpu-fatal-xids, --gpu-max-ecc-dbe double-bit ECC
    errors, the GPU lost from the bus, --gpu-max-retired-pages retired pages.

    Every user has a request bucket (--rate-user; operators and admins their own); an
    address with --auth-failures failed logins gets 429. Agents, operators and users are
    served in separate lanes (--node-lane, --admin-lane, --user-lane requests at once), so
    a flood of user requests never queues a node's sync. A plain user may hold at most
    --max-pending-jobs queued jobs, --max-reservations reservations and --max-tokens tokens.

    Tokens are stored as HMAC-SHA256 under a secret (--token-secret-file; servers sharing
    one database need the same one) and expire (--token-ttl; the fleet page's sign-in
    after --session-ttl). Mutating requests are audited (gpufleet admin audit), kept
    --audit-days. /metrics takes an operator's or admin's token unless --metrics-public."""
    from gpufleet.scheduler import POLICIES
    from gpufleet.server import ServerConfig, StartupError, run
    from gpufleet.server.db import default_database_url
    from gpufleet.server.health import HealthRules
    from gpufleet.server.pricing import load_prices
    from gpufleet.server.ratelimit import LaneSizes, Rate, RateLimits
    from gpufleet.server.services.caps import Caps

    if policy not in POLICIES:
        raise _fail(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}", 2)
    if tls_cert is None and not insecure_http and not _loopback(host):
        raise _fail(
            f"--host {host} is reachable from other machines: serve it with --tls-cert/--tls-key "
            "(gpufleet ca init makes them), or pass --insecure-http to send tokens in clear",
            2,
        )
    if (tls_key is not None or ca_dir is not None) and tls_cert is None:
        raise _fail("--tls-key and --ca-dir go with --tls-cert", 2)
    for f in (tls_cert, tls_key):
        if f is not None and not f.is_file():
            raise _fail(f"{f}: no such file", 2)
    try:
        timeout_s = parse_duration(node_timeout)
        rules = HealthRules(
            max_temp_c=gpu_max_temp,
            temp_for_s=parse_duration(gpu_hot_for),
            recover_after_s=parse_duration(gpu_recover_after),
            fatal_xids=frozenset(int(x) for x in gpu_fatal_xids.split(",") if x.strip()),
            max_ecc_dbe=gpu_max_ecc_dbe,
            max_retired_pages=gpu_max_retired_pages,
        )
        requeue_s = parse_duration(requeue_after)
        queue_wait_s = parse_duration(queue_wait_alert)
        idle_release_s = parse_duration(idle_release)
        schedule = None if prices is None else load_prices(prices)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise _fail(f"--prices {prices}: {exc}" if isinstance(exc, OSError) else str(exc), 2) from None
    try:
        token_ttl_s, session_ttl_s = parse_duration(token_ttl), parse_duration(session_ttl)
    except ValueError as exc:
        raise _fail(f"--token-ttl/--session-ttl: {exc}", 2) from None
    if token_ttl_s <= 0 or session_ttl_s <= 0:
        raise _fail("--token-ttl and --session-ttl must be longer than 0", 2)
    rates: dict[str, Rate | None] = {}
    for option, text in (
        ("rate-user", rate_user),
        ("rate-operator", rate_operator),
        ("rate-admin", rate_admin),
        ("auth-failures", auth_failures),
    ):
        try:
            rates[option] = Rate.parse(text)
        except ValueError as exc:
            raise _fail(f"--{option}: {exc}", 2) from None
    config = ServerConfig(
        database_url=database_url or default_database_url(),
        policy=policy,
        node_timeout_s=timeout_s,
        requeue_after_s=requeue_s,
        health=rules,
        admin_token=os.environ.get("GPUFLEET_ADMIN_TOKEN") or None,
        alert_webhook=alert_webhook or None,
        queue_wait_alert_s=queue_wait_s,
        reservation_idle_release_s=idle_release_s,
        prices=schedule,
        scheduler_process=not scheduler_thread,
        tls_cert=tls_cert,
        tls_key=tls_key,
        ca_dir=ca_dir,
        rates=RateLimits(
            user=rates["rate-user"],
            operator=rates["rate-operator"],
            admin=rates["rate-admin"],
            auth_failures=rates["auth-failures"],
        ),
        lanes=LaneSizes(node=node_lane, admin=admin_lane, user=user_lane),
        caps=Caps(pending_jobs=max_pending_jobs, reservations=max_reservations, tokens=max_tokens),
        token_secret_file=token_secret_file,
        token_ttl_s=token_ttl_s,
        session_ttl_s=session_ttl_s,
        audit_days=audit_days,
        metrics_public=metrics_public,
        team_cost_metrics=team_cost_metrics,
    )
    try:
        run(config, host=host, port=port)
    except StartupError as exc:
        raise _fail(str(exc)) from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@db_app.command("upgrade")
def db_upgrade(
    database_url: str | None = typer.Option(None, "--database-url", help="SQLAlchemy URL."),
) -> None:
    """Create or migrate the schema to this gpufleet's version."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpufleet.server import db

    url = database_url or db.default_database_url()
    try:
        db.upgrade(url)
    except SQLAlchemyError as exc:
        raise _fail(f"cannot upgrade {url}: {str(exc).splitlines()[0]}") from None
    typer.echo(f"database at revision {db.head_revision()}")


def login(
    url: str = typer.Argument(..., help="Server URL, e.g. http://127.0.0.1:8080"),
    token: str = typer.Option(..., "--token", help="Your API token."),
    ca_file: Path | None = typer.Option(
        None, "--ca-file", help="The cluster CA (ca.crt) for an https:// server gpufleet's CA signed."
    ),
) -> None:
    """Check the token against the server and save url, token and CA file (mode 0600)."""
    ca = str(ca_file.resolve()) if ca_file is not None else None
    try:
        with GpufleetClient(url, token, ca_file=ca) as c:
            me = c.whoami()
    except ClientError as exc:
        raise _fail(exc.message) from None
    except OSError as exc:  # an unreadable or malformed --ca-file
        raise _fail(f"--ca-file: {exc}", 2) from None
    path = save_connection(Connection(url=url, token=token, ca_file=ca))
    typer.echo(f"logged in as {me.name} ({me.role}); saved to {path}")


# -- jobs -----------------------------------------------------------------------------------


def _script_mode(args: list[str]) -> tuple[sbatch.SbatchOptions, list[str]] | None:
    """``submit job.sh [args]``: the script's directives and ``bash -c TEXT job.sh args``
    (the text travels with the job, as Slurm stores the batch script). Without a name
    (``--name``, ``#SBATCH --job-name``) the job is named after the script, as Slurm's."""
    if not args:
        return None
    path = Path(args[0])
    if not path.is_file():
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if not (text.startswith("#!") or "#SBATCH" in text):
        return None
    opts = sbatch.parse_script(text)
    if opts.name is None:
        opts = dataclasses.replace(opts, name=path.name)
    return opts, [*sbatch.SCRIPT_SHELL, text, path.name, *args[1:]]


def submit(
    args: list[str] = typer.Argument(..., help="-- COMMAND... or a #SBATCH script [ARGS]"),
    gpus: int | None = typer.Option(
        None, "--gpus", help="GPUs in all (default 1); 0 only in a CPU-only pool.", show_default=False
    ),
    nodes: int | None = typer.Option(None, "--nodes", "-N"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node"),
    gpu_type: str | None = typer.Option(None, "--gpu-type"),
    time_limit: str | None = typer.Option(None, "--time", "-t", help="2h, 90m, D-HH:MM:SS; bare = minutes"),
    name: str | None = typer.Option(None, "--name", "-J"),
    team: str | None = typer.Option(None, "--team"),
    priority: int | None = typer.Option(None, "--priority"),
    image: str | None = typer.Option(None, "--image"),
    pool: str | None = typer.Option(None, "--pool", "--partition", "-p"),
    requeue: bool | None = flag(
        "--requeue/--no-requeue",
        default=None,
        help="Run again after a node or GPU failure (default: yes).",
        show_default=False,
    ),
    max_attempts: int = typer.Option(5, "--max-attempts", min=1, help="Attempts in all, the first included."),
    requeue_backoff: str = typer.Option(
        "10s", "--requeue-backoff", help="Delay before the 2nd requeue, doubling (the 1st is immediate)."
    ),
    reservation: int | None = typer.Option(
        None, "--reservation", help="Run only inside this reservation (`gpufleet reservations`)."
    ),
    json_out: bool = json_flag("its id"),
) -> None:
    """Submit a job; prints its id. Options override #SBATCH directives."""
    script = _script_mode(args)
    opts, command = script if script is not None else (sbatch.SbatchOptions(), args)
    for w in opts.warnings:
        typer.echo(f"gpufleet: warning: {w}", err=True)
    limit_s: float | None = opts.time_limit_s
    if time_limit is not None:
        try:
            limit_s = parse_duration(time_limit, bare_unit_s=60)
        except ValueError as exc:
            raise _fail(f"--time: {exc}", 2) from None
    merged = sbatch.SbatchOptions(
        gpus=gpus if gpus is not None else opts.gpus,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else opts.gpus_per_node,
        nodes=nodes if nodes is not None else opts.nodes,
    )
    spec: dict[str, Any] = {
        "command": command,
        "gpus": sbatch.total_gpus(merged),
        "gpus_per_node": merged.gpus_per_node or 0,
        "nodes": merged.nodes or 0,
        "gpu_type": gpu_type or opts.gpu_type,
        "name": name or opts.name or "",
        "team": team,
        "priority": priority or 0,
        "image": image,
        "pool": pool or opts.pool or "default",
        "requeue": requeue if requeue is not None else (opts.requeue if opts.requeue is not None else True),
        "time_limit": limit_s,
        "max_attempts": max_attempts,
        "requeue_backoff": requeue_backoff,
        "output": opts.output,
        "error": opts.error,
    }
    if reservation is not None:
        spec["reservation"] = reservation
    with _client() as c:
        job = c.submit(spec)
        for w in job.warnings:
            typer.echo(f"gpufleet: warning: {w}", err=True)
        if json_out:
            _json(job.model_dump())
            return
        typer.echo(job.id)
        from gpufleet.cli.chargeback_cmds import price_hint

        with contextlib.suppress(ClientError):  # the job is in: a price is a courtesy
            for line in price_hint(c, job):
                typer.echo(f"gpufleet: {line}", err=True)


def queue(
    include_finished: bool = flag("--all", help="Include finished jobs."),
    user: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs (operators)."),
    pool: str | None = typer.Option(None, "--pool", "-p", help="Only jobs of this pool."),
    json_out: bool = JSON_OPT,
) -> None:
    """Waiting and running jobs, like squeue."""
    states = None if include_finished else ["PENDING", "HELD", "SCHEDULED", "RUNNING"]
    with _client() as c:
        items = c.all_jobs(states=states, user=user, pool=pool)
    if json_out:
        _json([j.model_dump() for j in items])
        return
    rows = []
    for j in items:
        where = " ".join(f"{a.node}:{','.join(map(str, a.gpus))}" for a in j.allocation)
        rows.append(
            (
                j.id,
                j.name[:20],
                j.user,
                j.state,
                j.gpus,
                j.queue_position,
                _eta(j.estimated_start),
                where or j.wait_reason or "",
            )
        )
    _table(("JOBID", "NAME", "USER", "STATE", "GPUS", "POS", "ETA", "NODES/REASON"), rows)


@jobs_app.command("list")
def jobs_list(
    state: list[str] = typer.Option([], "--state", "-s", help="Filter; repeat or comma-separate."),
    user: str | None = typer.Option(None, "--user", "-u"),
    team: str | None = typer.Option(None, "--team"),
    pool: str | None = typer.Option(None, "--pool", "-p"),
    json_out: bool = JSON_OPT,
) -> None:
    """List jobs (yours, or everyone's for operators)."""
    with _client() as c:
        items = c.all_jobs(states=state or None, user=user, team=team, pool=pool)
    if json_out:
        _json([j.model_dump() for j in items])
        return
    _table(
        ("JOBID", "NAME", "USER", "TEAM", "POOL", "STATE", "GPUS", "EXIT"),
        [(j.id, j.name[:20], j.user, j.team, j.pool, j.state, j.gpus, j.exit_code) for j in items],
    )


@jobs_app.command("show")
def jobs_show(job_id: int = typer.Argument(...), json_out: bool = json_flag("the summary")) -> None:
    """A job: what it asked for, where it runs or last ran, its queue position and its
    event history. A batch script shows its first lines."""
    with _client() as c:
        j = c.job(job_id)
    if json_out:
        _json(j.model_dump())
        return
    for line in jobview.show_lines(j, now=time.time()):
        typer.echo(line)


def _each(ids: list[int], act: Callable[[GpufleetClient, int], Any], verb: str) -> None:
    failed = 0
    try:
        with GpufleetClient.from_env() as c:
            for jid in ids:
                try:
                    j = act(c, jid)
                    typer.echo(f"{verb} {jid} ({j.state})")
                except ClientError as exc:
                    if exc.status is None:
                        raise
                    failed += 1
                    typer.echo(f"gpufleet: error: job {jid}: {exc.message}", err=True)
    except ClientError as exc:
        raise _fail(exc.message) from None
    if failed:
        raise typer.Exit(1)


def cancel(job_ids: list[int] = typer.Argument(...)) -> None:
    """Cancel jobs (scancel)."""
    _each(job_ids, GpufleetClient.cancel, "cancelled")


def hold(job_ids: list[int] = typer.Argument(...)) -> None:
    """Hold pending jobs (scontrol hold)."""
    _each(job_ids, GpufleetClient.hold, "held")


def release(job_ids: list[int] = typer.Argument(...)) -> None:
    """Release held jobs (scontrol release)."""
    _each(job_ids, GpufleetClient.release, "released")


def nodes(
    name: str | None = typer.Argument(None, help="Show one node in detail."),
    pool: str | None = typer.Option(None, "--pool", "-p"),
    json_out: bool = JSON_OPT,
) -> None:
    """Nodes and their GPUs, like sinfo."""
    with _client() as c:
        items = [c.node(name)] if name else c.nodes(pool=pool)
    if json_out:
        _json([n.model_dump() for n in items])
        return
    _table(
        ("NODE", "POOL", "STATE", "FREE", "USED", "TOTAL", "MODEL"),
        [
            (
                n.name,
                n.pool,
                n.state + (",cordoned" if n.cordoned else ""),
                n.gpus_free,
                n.gpus_used,
                n.gpus_total,
                n.model,
            )
            for n in items
        ],
    )
    if name:
        for g in items[0].gpus:
            typer.echo(
                f"  gpu{g.index} {g.model} {g.uuid} nvlink={g.nvlink_domain} "
                f"{'ok' if g.healthy else 'UNHEALTHY'} job={g.job_id or '-'}"
            )


# -- admin ----------------------------------------------------------------------------------


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
        raise _fail(f"--role: {role!r} is not one of admin, operator, user", 2)
    if database_url is not None:
        from gpufleet.server.direct import create_user_direct
        from gpufleet.server.problems import Failure

        made = create_user_direct(
            database_url=database_url, name=name, role=role, teams=team, secret_file=token_secret_file
        )
        if isinstance(made, Failure):
            raise _fail(f"cannot create user: {made.detail}")
        typer.echo(made)
        return
    with _client() as c:
        typer.echo(c.create_user(name, role=role, teams=team).token)


@admin_app.command("create-team")
def create_team(name: str = typer.Argument(...)) -> None:
    """Create a team."""
    with _client() as c:
        typer.echo(f"team {c.create_team(name).name} created")


@admin_app.command("add-member")
def add_member(team: str = typer.Argument(...), user: str = typer.Argument(...)) -> None:
    """Add a user to a team."""
    with _client() as c:
        t = c.add_member(team, user)
    typer.echo(f"team {t.name}: {', '.join(t.members)}")


@admin_app.command("set-quota")
def set_quota(
    team: str = typer.Argument(...),
    gpus: int = typer.Option(..., "--gpus", min=0, help="Nominal share (fair-share weight)."),
    limit: int | None = typer.Option(None, "--limit", min=0, help="Hard cap (default: none)."),
) -> None:
    """Set a team's quota."""
    with _client() as c:
        t = c.set_quota(team, gpus=gpus, limit=limit)
    typer.echo(f"team {t.name}: {t.quota_gpus} GPUs nominal, limit {t.quota_limit or 'none'}")


@admin_app.command("create-pool")
def create_pool(
    name: str = typer.Argument(...),
    cpu_only: bool = flag("--cpu-only", help="A pool for 0-GPU jobs."),
    description: str = typer.Option("", "--description"),
) -> None:
    """Create a pool (partition)."""
    with _client() as c:
        p = c.create_pool(name, gpu=not cpu_only, description=description)
    typer.echo(f"pool {p.name} created ({'GPU' if p.gpu else 'CPU-only'})")


@admin_app.command("delete-pool")
def delete_pool(name: str = typer.Argument(...)) -> None:
    """Delete an unused pool."""
    with _client() as c:
        typer.echo(f"pool {c.delete_pool(name).name} deleted")


@admin_app.command("users")
def list_users(json_out: bool = JSON_OPT) -> None:
    """List users."""
    with _client() as c:
        items = c.users()
    if json_out:
        _json([u.model_dump() for u in items])
    else:
        rows = [(u.name, u.role, ",".join(u.teams), u.default_team or "-") for u in items]
        _table(("USER", "ROLE", "TEAMS", "DEFAULT TEAM"), rows)


def default_team(
    team: str | None = typer.Argument(None, help="The team to make the default; without it, show it."),
    user: str | None = typer.Option(None, "--user", help="Admins: another user's."),
) -> None:
    """Your default team: where a job goes when `submit` names no --team (Slurm's default
    account). It starts as the first team you joined."""
    with _client() as c:
        if team is None:
            me = c.whoami() if user is None else next((u for u in c.users() if u.name == user), None)
            if me is None:
                raise _fail(f"no user {user}")
            teams = ", ".join(me.teams) or "-"
            typer.echo(f"{me.name}: default team {me.default_team or '- (none)'}; teams: {teams}")
            return
        out = c.set_default_team(user or c.whoami().name, team)
    typer.echo(f"{out.name}: default team {out.default_team}")


@admin_app.command("teams")
def list_teams(json_out: bool = JSON_OPT) -> None:
    """List teams, quotas and budgets."""
    with _client() as c:
        items = c.teams()
    if json_out:
        _json([t.model_dump() for t in items])
    else:
        _table(
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
def list_pools(json_out: bool = JSON_OPT) -> None:
    """List pools."""
    with _client() as c:
        items = c.pools()
    if json_out:
        _json([p.model_dump() for p in items])
    else:
        _table(
            ("POOL", "KIND", "NODES", "DESCRIPTION"),
            [(p.name, "gpu" if p.gpu else "cpu", p.nodes, p.description) for p in items],
        )


@admin_app.command("audit")
def audit(
    user: str | None = typer.Option(None, "--user", help="Only this user's requests."),
    since: str | None = typer.Option(None, "--since", help="Only this recent, e.g. 1h or 1d."),
    limit: int = typer.Option(100, "--limit", min=1, max=100_000, help="At most this many rows."),
    json_out: bool = JSON_OPT,
) -> None:
    """The audit log: every mutating API request (who, from where, what, outcome), newest
    first. Admins only; agents' syncs are not in it."""
    try:
        start = None if since is None else time.time() - parse_duration(since)
    except ValueError as exc:
        raise _fail(f"--since: {exc}", 2) from None
    with _client() as c:
        rows = c.audit(user=user, since=start, limit=limit)
    if json_out:
        _json([r.model_dump() for r in rows])
        return
    _table(
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


@tokens_app.command("list")
def tokens_list(
    user: str | None = typer.Option(None, "--user", help="Admins: another user's tokens."),
    json_out: bool = JSON_OPT,
) -> None:
    """List tokens (only a hint of each is shown)."""
    with _client() as c:
        items = c.tokens(user=user)
    if json_out:
        _json([t.model_dump() for t in items])
    else:
        _table(
            ("ID", "USER", "NAME", "KIND", "HINT", "EXPIRES", "REVOKED"),
            [
                (t.id, t.user, t.name, t.kind, "..." + t.hint, _expires(t.expires_at), t.revoked)
                for t in items
            ],
        )


def _expires(at: float | None) -> str:
    if at is None:
        return "never"
    delta = at - time.time()
    return "expired" if delta <= 0 else "in " + format_duration(delta)


@tokens_app.command("create")
def tokens_create(
    name: str = typer.Option("cli", "--name"),
    user: str | None = typer.Option(None, "--user", help="Admins: for another user."),
    ttl: str | None = typer.Option(
        None, "--ttl", help="Lifetime, e.g. 1h or 30d (default and most: the server's --token-ttl)."
    ),
) -> None:
    """Create a token; printed once."""
    with _client() as c:
        typer.echo(c.create_token(name=name, user=user, expires_in=ttl).token)


@tokens_app.command("revoke")
def tokens_revoke(token_id: int = typer.Argument(...)) -> None:
    """Revoke a token."""
    with _client() as c:
        typer.echo(f"token {c.revoke_token(token_id).id} revoked")


def register(app: typer.Typer) -> None:
    app.command("server")(server)
    app.command("login")(login)
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    app.command("queue")(queue)
    app.command("cancel")(cancel)
    app.command("hold")(hold)
    app.command("release")(release)
    app.command("nodes")(nodes)
    app.command("default-team")(default_team)
    app.add_typer(jobs_app, name="jobs")
    app.add_typer(admin_app, name="admin")
    app.add_typer(db_app, name="db")
    app.add_typer(tokens_app, name="tokens")


__all__ = ["register"]
