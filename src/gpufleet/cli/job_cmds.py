"""Job commands: ``gpufleet queue``, ``jobs list|show``, ``cancel``, ``hold``, ``release``,
``requeue``, ``update`` and ``logs`` (``submit`` and ``run``: ``submit_cmds``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli import slurmnames, words
from gpufleet.cli._common import (
    BAD_INPUT,
    FAILED,
    client,
    error,
    fail,
    print_json,
    print_table,
    stream_logs,
)
from gpufleet.cli.apps import jobs_app
from gpufleet.cli.options import flag, json_flag
from gpufleet.client import ClientError, GpufleetClient
from gpufleet.migindex import device_labels, gpus_label
from gpufleet.timefmt import format_duration, parse_duration

if TYPE_CHECKING:
    from gpufleet.api.jobs import Cancelled


def _eta(at: float | None) -> str:
    if at is None:
        return "-"
    delta = at - time.time()
    return "now" if delta <= 1 else "in " + format_duration(delta)


def _ends(at: float) -> str:
    """A running job's predicted end, for the ETA column (``jobs show`` says its basis)."""
    delta = at - time.time()
    return "overdue" if delta < -1 else "ends " + _eta(at)


def queue(
    include_finished: bool = flag("--all", help="Include finished jobs."),
    user: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs (operators)."),
    pool: str | None = typer.Option(None, "--pool", "-p", help="Only jobs of this pool."),
    json_out: bool = json_flag(),
) -> None:
    """Waiting and running jobs, like squeue.

    An array's tasks are 123_4; its waiting tasks are one line, 123_[5-99]. A waiting
    job's reason is Slurm's (Priority, Resources, Dependency, JobArrayTaskLimit,
    JobHeldUser...) with gpufleet's detail."""
    states = None if include_finished else ["PENDING", "HELD", "SCHEDULED", "RUNNING"]
    with client() as c:  # the table: an array's waiting tasks folded by the server, one item
        items = c.job_listing(states=states, user=user, pool=pool, collapsed=not json_out)
    if json_out:
        print_json(items)
        return
    try:
        rows = queue_rows(items)
    except (KeyError, TypeError) as exc:  # not a gpufleet server's jobs
        raise fail(f"unexpected answer from /jobs: a job without {exc}") from None
    print_table(("JOBID", "NAME", "USER", "STATE", "GPUS", "POS", "ETA", "NODES/REASON"), rows)


def queue_rows(items: Sequence[dict[str, Any]]) -> list[tuple[object, ...]]:
    """The queue's rows from the listing's JSON objects (``JobOut``'s fields): one per
    job, but one per array for the tasks of an array that wait in the same state (at the
    first one's place, with its position, ETA and reason), as squeue shows a pending
    array. The server folds them (an item with ``array_tasks``); a server from before
    lists every task, folded here."""
    waiting: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for j in items:
        if (
            j.get("array_tasks") is None
            and j.get("array_job_id") is not None
            and j.get("array_task_id") is not None
            and j["state"]
            in (
                "PENDING",
                "HELD",
            )
        ):
            waiting.setdefault((j["array_job_id"], j["state"]), []).append(j)
    rows: list[tuple[object, ...]] = []
    for j in items:
        array = j.get("array_job_id")
        tasks = waiting.get((array or 0, j["state"])) if array is not None else None
        if tasks is not None and j is not tasks[0]:
            continue  # shown on its array's line
        if j.get("array_tasks") is not None:
            shown = slurmnames.folded_ids(array or 0, str(j["array_tasks"]), j.get("array_task_count"))
        elif tasks is not None:
            shown = slurmnames.array_ids(array or 0, [t["array_task_id"] for t in tasks])
        else:
            shown = slurmnames.job_id(j["id"], array, j.get("array_task_id"))
        where = " ".join(
            f"{a['node']}:{','.join(device_labels(a['gpus']))}" for a in j.get("allocation") or ()
        )
        eta = _eta(j.get("estimated_start"))
        if j["state"] == "RUNNING" and j.get("predicted_end") is not None:
            eta = _ends(j["predicted_end"])  # issue 33: from the jobs like it that ended
        shown_row = (
            shown,
            str(j["name"])[:20],
            j["user"],
            j["state"],
            gpus_label(j["gpus"], j.get("gpu_type")),
            j.get("queue_position"),
            eta,
        )
        rows.append((*shown_row, where or j.get("wait_reason")))
    return rows


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
        j = c.request("GET", f"/jobs/{job_id}")  # the server's JSON: no pydantic (jobview)
    if json_out:
        print_json(j)
        return
    from gpufleet.cli import jobview  # placements, scripts: not for the commands that list

    for line in jobview.show_lines(j, now=time.time()):
        typer.echo(line)


def _each(ids: list[int], act: Callable[[GpufleetClient, int], str]) -> None:
    """``act`` on each job (the line it returns is printed); one the server refuses is
    reported and the rest go on (exit 1 at the end). An unreachable server ends it at once."""
    failed = 0
    try:
        with GpufleetClient.from_env() as c:
            for jid in ids:
                try:
                    typer.echo(act(c, jid))
                except ClientError as exc:
                    if exc.status is None:
                        raise
                    failed += 1
                    error(
                        exc.message if exc.status == 404 else f"job {jid}: {exc.message}"
                    )  # 404: "no job N"
    except ClientError as exc:
        raise fail(exc.message) from None
    if failed:
        raise typer.Exit(FAILED)


def _one(one: Callable[[GpufleetClient, int], Any], past: str) -> Callable[[GpufleetClient, int], str]:
    def act(c: GpufleetClient, jid: int) -> str:
        return f"{past} {jid} ({one(c, jid).state})"

    return act


def _array_or_one(
    verb: str, one: Callable[[GpufleetClient, int], Any], past: str
) -> Callable[[GpufleetClient, int], str]:
    """``verb`` (hold, release) on every task of array ``jid`` in one request (as
    ``scontrol hold`` takes an array's id), or on job ``jid`` when it is no array of
    yours (or the server is from before bulk changes: 404/405; an id out of range: 422)."""

    def act(c: GpufleetClient, jid: int) -> str:
        try:
            out = c.change_many(verb, {"array": jid})
        except ClientError as exc:
            if exc.status not in (404, 405, 422):
                raise
            return _one(one, past)(c, jid)
        if not out.changed and not out.skipped:
            return _one(one, past)(c, jid)
        if not out.changed:
            raise ClientError(f"array {jid}: no task to {verb} (none is {_FROM[verb]})", status=409)
        return f"{past} array {jid} ({words.count(len(out.changed), 'task')})"

    return act


_FROM = {"hold": "PENDING", "release": "HELD"}


def cancel(
    job_ids: list[str] = typer.Argument(
        None,
        help="123 (a job, or the whole array 123), 123_4 or 123_[1-3] (tasks of array 123).",
        show_default=False,
    ),
    user: str | None = typer.Option(None, "--user", "-u", help="Only this user's jobs (others': operators)."),
    state: list[str] = typer.Option(
        [], "--state", "-t", help="Only jobs in these states (PENDING, RUNNING...); repeat or comma-separate."
    ),
    name: str | None = typer.Option(None, "--name", "-n", "--jobname", help="Only jobs of this name."),
) -> None:
    """Cancel jobs (scancel): by id, or every job of yours the filters match.

    The filters narrow the ids given; without ids they choose the jobs. Exit 1 when a
    job named is not there or has ended."""
    try:
        refs = [slurmnames.parse_ref(x) for x in job_ids or []]
        states = slurmnames.states_of(state)
    except ValueError as exc:
        raise fail(str(exc), BAD_INPUT) from None
    filters: dict[str, Any] = {"user": user, "name": name, "states": states or None}
    filters = {k: v for k, v in filters.items() if v is not None}
    if not refs and not filters:
        raise fail("say which jobs: IDs, --user, --state or --name", BAD_INPUT)
    failed = False
    with client() as c:
        if not refs:
            out = c.cancel_many(filters)
            typer.echo(f"cancelled {words.count(len(out.cancelled), 'job')}" + _listed(out.cancelled))
            failed = _skipped(out.skipped)
        for ref in refs:
            failed = _cancel_ref(c, ref, filters) or failed
    if failed:
        raise typer.Exit(FAILED)


def _listed(ids: Sequence[int]) -> str:
    return (": " + " ".join(map(str, ids[:20])) + (" ..." if len(ids) > 20 else "")) if ids else ""


def _skipped(ids: Sequence[int]) -> bool:
    if ids:
        error(f"not cancelled (ended meanwhile, or changing too fast): {' '.join(map(str, ids))}")
    return bool(ids)


def _cancel_ref(c: GpufleetClient, ref: slurmnames.JobRef, filters: dict[str, Any]) -> bool:
    """Cancel one id of the command line; True if it failed (reported)."""
    if ref.tasks is not None:
        by_task = {j.array_task_id: j for j in c.all_jobs(array=ref.job)}
        missing = [t for t in ref.tasks if t not in by_task]
        for t in missing:
            error(f"not found: no job {ref.job}_{t}")
        ids = [by_task[t].id for t in ref.tasks if t in by_task]
        if not ids:
            return True
        out = c.cancel_many({"ids": ids, **filters})
        done = {j.id: j.array_task_id or 0 for j in by_task.values() if j.id in out.cancelled}
        if done:
            typer.echo(f"cancelled {slurmnames.array_ids(ref.job, done.values())}")
        return bool(missing) | _skipped(out.skipped) | _ended(ids, out, filters)
    try:
        job = c.job(ref.job)
    except ClientError as exc:
        if exc.status != 404:
            raise
        error(exc.message)
        return True
    if job.array_job_id == job.id:
        out = c.cancel_many({"array": job.id, **filters})
        if out.cancelled:
            typer.echo(f"cancelled array {job.id} ({words.count(len(out.cancelled), 'task')})")
        elif not out.skipped and not filters:
            error(f"array {job.id}: every task has ended")
            return True
        return _skipped(out.skipped)
    out = c.cancel_many({"ids": [job.id], **filters})
    if out.cancelled:
        typer.echo(f"cancelled {slurmnames.job_id(job.id, job.array_job_id, job.array_task_id)}")
    return _skipped(out.skipped) | _ended([job.id], out, filters)


def _ended(ids: Sequence[int], out: Cancelled, filters: dict[str, Any]) -> bool:
    """Ids named that matched nothing (unless a filter left them out): already ended."""
    if filters:
        return False
    gone = [i for i in ids if i not in out.cancelled and i not in out.skipped]
    if gone:
        error(f"already ended, not cancelled: {' '.join(map(str, gone))}")
    return bool(gone)


def requeue(job_ids: list[int] = typer.Argument(...)) -> None:
    """Put running jobs back in the queue (scontrol requeue): each stops and waits again,
    keeping its id and history."""
    _each(job_ids, _one(GpufleetClient.requeue, "requeued"))


def update(
    job_id: int = typer.Argument(...),
    time_limit: str | None = typer.Option(
        None, "--time-limit", "--time", "-t", help="A new limit: 2h, 90m, D-HH:MM:SS; bare = minutes."
    ),
    name: str | None = typer.Option(None, "--name", "-J", help="A new name."),
    held: bool | None = flag("--hold/--release", default=None, help="Hold a pending job, or release it."),
    json_out: bool = json_flag("the summary"),
) -> None:
    """Change a job (scontrol update): its time limit (only down, except for operators),
    its name, held or not."""
    changes: dict[str, Any] = {"name": name, "held": held}
    if time_limit is not None:
        try:
            changes["time_limit"] = parse_duration(time_limit, bare_unit_s=60)
        except ValueError as exc:
            raise fail(f"--time-limit={time_limit}: {exc}", BAD_INPUT) from None
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        raise fail("say what to change: --time-limit, --name, --hold or --release", BAD_INPUT)
    with client() as c:
        j = c.update(job_id, changes)
    if json_out:
        print_json(j.model_dump())
        return
    limit = "none" if j.time_limit_s is None else format_duration(j.time_limit_s)
    typer.echo(f"updated {job_id}: {j.state}, name {j.name}, time limit {limit}")


def hold(job_ids: list[int] = typer.Argument(...)) -> None:
    """Hold pending jobs (scontrol hold).

    An array's id holds every pending task of it, in one request."""
    _each(job_ids, _array_or_one("hold", GpufleetClient.hold, "held"))


def release(job_ids: list[int] = typer.Argument(...)) -> None:
    """Release held jobs (scontrol release).

    An array's id releases every held task of it, in one request."""
    _each(job_ids, _array_or_one("release", GpufleetClient.release, "released"))


def logs(
    job_id: int = typer.Argument(...),
    follow: bool = flag("--follow", "-f", help="Stream until the job is over."),
) -> None:
    """A job's output (stdout and stderr, as its nodes shipped them)."""
    stream_logs(job_id, follow=follow)


__all__ = [
    "cancel",
    "hold",
    "jobs_list",
    "jobs_show",
    "logs",
    "queue",
    "queue_rows",
    "release",
    "requeue",
    "update",
]
