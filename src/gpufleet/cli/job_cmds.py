"""Job commands: ``gpufleet submit``, ``queue``, ``jobs list|show``, ``cancel``, ``hold``,
``release`` and ``logs``."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli import jobview, sbatch, words
from gpufleet.cli._common import (
    BAD_INPUT,
    FAILED,
    client,
    error,
    fail,
    print_json,
    print_table,
    stream_logs,
    warn,
)
from gpufleet.cli.apps import jobs_app
from gpufleet.cli.localtime import local_zone, show_time
from gpufleet.cli.options import flag, json_flag
from gpufleet.client import ClientError, GpufleetClient
from gpufleet.timefmt import format_duration, parse_duration

if TYPE_CHECKING:
    from gpufleet.api.jobs import JobOut


def _eta(at: float | None) -> str:
    if at is None:
        return "-"
    delta = at - time.time()
    return "now" if delta <= 1 else "in " + format_duration(delta)


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
        warn(w)
    limit_s: float | None = opts.time_limit_s
    if time_limit is not None:
        try:
            limit_s = parse_duration(time_limit, bare_unit_s=60)
        except ValueError as exc:
            raise fail(f"--time: {exc}", BAD_INPUT) from None
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
    with client() as c:
        job = c.submit(spec)
        for w in job.warnings:
            warn(w)
        if json_out:
            print_json(job.model_dump())
            return
        typer.echo(job.id)
        with contextlib.suppress(ClientError):  # the job is in: a price is a courtesy
            for line in price_hint(c, job):
                typer.echo(f"gpufleet: {line}", err=True)


def price_hint(c: GpufleetClient, job: JobOut) -> list[str]:
    """What a just-submitted job costs per hour now and when it would be cheaper
    (``gpufleet submit`` prints it: work that can wait may be held and released
    off-peak). Empty when no prices are set. The models are those the job could get:
    the fleet's that match its ``gpu_type`` as the scheduler matches them (all the
    schedule's, before any node registered)."""
    if job.gpus == 0:
        return []
    out = c.prices()
    if out.schedule is None:
        return []
    from gpufleet.scheduler import gpu_type_matches  # the scheduling core: only with prices set

    zone = local_zone()
    rows = [p for p in out.prices if not job.gpu_type or gpu_type_matches(job.gpu_type, p.gpu_type)]
    rows = [p for p in rows if p.in_fleet] or rows
    gpus = words.count(job.gpus, "GPU")
    lines = []
    for p in rows[:4]:
        line = f"{p.gpu_type} costs {p.price:.4g}/GPU-hour now ({gpus}: {p.price * job.gpus:.4g}/h)"
        if p.next_cheaper_at is not None and p.next_cheaper_price is not None:
            line += f"; {p.next_cheaper_price:.4g} from {show_time(p.next_cheaper_at, zone)}"
        lines.append(line)
    return lines


def queue(
    include_finished: bool = flag("--all", help="Include finished jobs."),
    user: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs (operators)."),
    pool: str | None = typer.Option(None, "--pool", "-p", help="Only jobs of this pool."),
    json_out: bool = json_flag(),
) -> None:
    """Waiting and running jobs, like squeue."""
    states = None if include_finished else ["PENDING", "HELD", "SCHEDULED", "RUNNING"]
    with client() as c:
        items = c.all_jobs(states=states, user=user, pool=pool)
    if json_out:
        print_json([j.model_dump() for j in items])
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
    print_table(("JOBID", "NAME", "USER", "STATE", "GPUS", "POS", "ETA", "NODES/REASON"), rows)


@jobs_app.command("list")
def jobs_list(
    state: list[str] = typer.Option([], "--state", "-s", help="Filter; repeat or comma-separate."),
    user: str | None = typer.Option(None, "--user", "-u"),
    team: str | None = typer.Option(None, "--team"),
    pool: str | None = typer.Option(None, "--pool", "-p"),
    json_out: bool = json_flag(),
) -> None:
    """List jobs (yours, or everyone's for operators)."""
    with client() as c:
        items = c.all_jobs(states=state or None, user=user, team=team, pool=pool)
    if json_out:
        print_json([j.model_dump() for j in items])
        return
    print_table(
        ("JOBID", "NAME", "USER", "TEAM", "POOL", "STATE", "GPUS", "EXIT"),
        [(j.id, j.name[:20], j.user, j.team, j.pool, j.state, j.gpus, j.exit_code) for j in items],
    )


@jobs_app.command("show")
def jobs_show(job_id: int = typer.Argument(...), json_out: bool = json_flag("the summary")) -> None:
    """A job: what it asked for, where it runs or last ran, its queue position and its
    event history. A batch script shows its first lines."""
    with client() as c:
        j = c.job(job_id)
    if json_out:
        print_json(j.model_dump())
        return
    for line in jobview.show_lines(j, now=time.time()):
        typer.echo(line)


def _each(ids: list[int], act: Callable[[GpufleetClient, int], Any], verb: str) -> None:
    """``act`` on each job; one the server refuses is reported and the rest go on (exit 1
    at the end). An unreachable server ends it at once."""
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
                    error(f"job {jid}: {exc.message}")
    except ClientError as exc:
        raise fail(exc.message) from None
    if failed:
        raise typer.Exit(FAILED)


def cancel(job_ids: list[int] = typer.Argument(...)) -> None:
    """Cancel jobs (scancel)."""
    _each(job_ids, GpufleetClient.cancel, "cancelled")


def hold(job_ids: list[int] = typer.Argument(...)) -> None:
    """Hold pending jobs (scontrol hold)."""
    _each(job_ids, GpufleetClient.hold, "held")


def release(job_ids: list[int] = typer.Argument(...)) -> None:
    """Release held jobs (scontrol release)."""
    _each(job_ids, GpufleetClient.release, "released")


def logs(
    job_id: int = typer.Argument(...),
    follow: bool = flag("--follow", "-f", help="Stream until the job is over."),
) -> None:
    """A job's output (stdout and stderr, as its nodes shipped them)."""
    stream_logs(job_id, follow=follow)


__all__ = ["cancel", "hold", "jobs_list", "jobs_show", "logs", "price_hint", "queue", "release", "submit"]
