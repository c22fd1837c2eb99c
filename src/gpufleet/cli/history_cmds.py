"""``gpufleet history``: past and present jobs with sacct's habits and columns
(``sacct.py``). Its ``--parsable2`` output is what ``gpufleet simulate --trace FILE``
reads as a sacct export.

The window (``-S``/``-E``, Slurm's time forms, local time) selects the jobs that were
in the system at some time in it: submitted by its end, not ended before its start.
As sacct: from midnight today to now unless told; ``-j`` without ``-S`` looks at every
time; your own jobs unless ``-a`` or ``-u`` (others': operators).

Jobs are read as the server's JSON (``GpufleetClient.job_listing``, as ``gpufleet queue``
reads them), never validated as the API's models: ``sacct`` runs this command, and
importing pydantic and the models, then validating every job, was ~100 ms of it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli import sacct, slurmnames
from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table
from gpufleet.cli.localtime import parse_slurm_time
from gpufleet.cli.options import flag, json_flag

if TYPE_CHECKING:
    from gpufleet.cli.sacct import Job
    from gpufleet.client import GpufleetClient


def _csv(values: list[str]) -> list[str]:
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def history(
    starttime: str | None = typer.Option(
        None, "--starttime", "-S", help="From (default midnight): now-2days, 16:00, MMDD, 2026-03-01T09:00."
    ),
    endtime: str | None = typer.Option(None, "--endtime", "-E", help="To (default now); as --starttime."),
    state: list[str] = typer.Option(
        [],
        "--state",
        "-s",
        help="Only these states: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT.",
    ),
    user: list[str] = typer.Option([], "--user", "-u", help="These users' jobs (others': operators)."),
    allusers: bool = flag("--allusers", "-a", help="Everyone's jobs (operators; others see their own)."),
    jobs: list[str] = typer.Option([], "--jobs", "-j", help="Only these jobs: 123, 123_4 (comma-separated)."),
    partition: str | None = typer.Option(None, "--partition", "-r", help="Only this pool's jobs."),
    account: str | None = typer.Option(None, "--accounts", "-A", help="Only this team's jobs."),
    name: str | None = typer.Option(None, "--name", help="Only jobs of this name."),
    fmt: str = typer.Option(
        sacct.DEFAULT_FORMAT, "--format", "-o", help="Fields, comma-separated (NAME%WIDTH cuts one)."
    ),
    parsable2: bool = flag("--parsable2", "-P", help="`|` between fields, header first (sacct -P)."),
    parsable: bool = flag("--parsable", "-p", help="As --parsable2 with a `|` after the last field too."),
    noheader: bool = flag("--noheader", "-n", help="No header line."),
    allocations: bool = flag("--allocations", "-X", help="Jobs only, not their steps (123.0, 123.1: srun)."),
    json_out: bool = json_flag(),
) -> None:
    """Jobs that were in the system in a window of time, like sacct (default: since
    midnight).

    --parsable2 output is a sacct export that `gpufleet simulate --trace` replays.
    Fields: JobID, JobIDRaw, JobName, User, Account, Partition, Submit, Eligible, Start,
    End, Elapsed, ElapsedRaw, Timelimit, TimelimitRaw, AllocTRES, ReqTRES, AllocCPUS,
    ReqCPUS, ReqMem, NNodes, NodeList, State, ExitCode, Priority, Reason, Dependency."""
    now = time.time()
    try:
        cols = sacct.columns(fmt)
        states = slurmnames.states_of(state)
        refs = [slurmnames.parse_ref(x) for x in _csv(jobs)]
        since, until = _window(starttime, endtime, now=now, any_time=bool(refs))
    except ValueError as exc:
        raise fail(str(exc), BAD_INPUT) from None
    with client() as c:
        users: list[str | None] = list(_csv(user))
        if not users:
            users = [None if allusers else str(c.request("GET", "/users/me")["name"])]
        # -j: the server lists only those jobs and arrays (sacct -j reads two pages less)
        ids = sorted({r.job for r in refs}) if 0 < len(refs) <= 1000 else None
        found = _jobs(
            c, users, states=states, since=since, until=until, pool=partition, team=account, ids=ids
        )
    if refs:
        found = [j for j in found if any(_is(j, r) for r in refs)]
    if name is not None:
        found = [j for j in found if j["name"] == name]
    step_ids: dict[int, str] = {}
    if not allocations and not json_out and found:
        with client() as c:
            found, step_ids = _with_steps(c, found)
    if json_out:
        print_json(found)
    elif parsable or parsable2:
        lines = sacct.parsable(found, cols, now=now, trailing=parsable, header=not noheader)
        for line in _step_cells(lines, cols, step_ids, sep="|", header=not noheader):
            typer.echo(line)
    elif noheader:
        for row in _step_rows(sacct.rows(found, cols, now=now), cols, step_ids):
            typer.echo("  ".join(row))
    else:
        print_table([n for n, _ in cols], _step_rows(sacct.rows(found, cols, now=now), cols, step_ids))


def _with_steps(c: GpufleetClient, jobs: list[Job]) -> tuple[list[Job], dict[int, str]]:
    """Each job followed by its steps (``srun``: ``123.0``, ``123.1``, as sacct lists
    them), a step shown as a copy of its job with the step's name, state, times and exit
    code; and the index of each step line -> its id (the JobID cells)."""
    found: dict[int, list[dict[str, Any]]] = {}
    started = [j["id"] for j in jobs if j["started_at"] is not None or j["scheduled_at"] is not None]
    for i in range(0, len(started), 500):
        got = c.request("GET", "/steps", params={"job": started[i : i + 500]})
        for st in got["steps"]:
            found.setdefault(int(st["job_id"]), []).append(st)
    out: list[Job] = []
    ids: dict[int, str] = {}
    for j in jobs:
        out.append(j)
        for st in found.get(j["id"], []):
            ids[len(out)] = str(st["id"])
            changes = {
                "name": st["name"],
                "state": st["state"],
                "exit_code": st["exit_code"],
                "started_at": st["created_at"],
                "ended_at": st["ended_at"] if st["ended_at"] is not None else j["ended_at"],
            }
            out.append({**j, **changes})
    return out, ids


def _step_rows(
    rows: list[list[str]], cols: list[tuple[str, int | None]], ids: dict[int, str]
) -> list[list[str]]:
    """The JobID/JobIDRaw cells of step lines: the step's id."""
    where = [k for k, (name, _) in enumerate(cols) if name in ("JobID", "JobIDRaw")]
    for i, sid in ids.items():
        for k in where:
            rows[i][k] = sid
    return rows


def _step_cells(
    lines: list[str], cols: list[tuple[str, int | None]], ids: dict[int, str], *, sep: str, header: bool
) -> list[str]:
    """``_step_rows`` for ``--parsable`` lines (after the header line, if any)."""
    if not ids:
        return lines
    first = 1 if header else 0
    rows = [line.split(sep) for line in lines[first:]]
    return lines[:first] + [sep.join(r) for r in _step_rows(rows, cols, ids)]


def _window(
    starttime: str | None, endtime: str | None, *, now: float, any_time: bool
) -> tuple[float | None, float | None]:
    if starttime is not None:
        since: float | None = parse_slurm_time(starttime, now=now, flag="--starttime", future=False)
    elif any_time:
        since = None
    else:
        since = parse_slurm_time("midnight", now=now, flag="--starttime", future=False)
    until = None if endtime is None else parse_slurm_time(endtime, now=now, flag="--endtime", future=False)
    if since is not None and until is not None and until < since:
        raise ValueError(f"--endtime={endtime} is before --starttime")
    return since, until


def _jobs(
    c: GpufleetClient,
    users: list[str | None],
    *,
    states: list[str],
    since: float | None,
    until: float | None,
    pool: str | None,
    team: str | None,
    ids: list[int] | None = None,
) -> list[Job]:
    out: dict[int, Job] = {}
    for u in users:
        got = c.job_listing(
            states=states or None, user=u, pool=pool, team=team, since=since, until=until, ids=ids
        )
        out |= {int(j["id"]): j for j in got}
    return [out[k] for k in sorted(out)]


def _is(job: Job, ref: slurmnames.JobRef) -> bool:
    if ref.tasks is None:
        return ref.job in (job["id"], job.get("array_job_id"))
    return job.get("array_job_id") == ref.job and job.get("array_task_id") in ref.tasks


__all__ = ["history"]
