"""``gpufleet submit`` (sbatch) and ``gpufleet run`` (srun): one job from a command or a
batch script, its flags and directives read by ``sbatch`` and turned into the API's
submission by ``batch``. ``run`` then prints the job's output as it comes and exits
with the job's exit code."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli import batch, gpufleet_directives, sbatch, slurmflags, words
from gpufleet.cli._common import BAD_INPUT, FAILED, client, error, fail, print_json, stream_logs, warn
from gpufleet.cli.localtime import local_zone, show_time
from gpufleet.cli.options import flag, json_flag
from gpufleet.client import ClientError, GpufleetClient

if TYPE_CHECKING:
    from gpufleet.api.jobs import JobOut


def _options(
    args: list[str], flags: dict[str, Any], *, batch_file: bool
) -> tuple[slurmflags.SbatchOptions, list[str]]:
    """The job's options (its script's directives, then the flags over them) and its
    command: ``submit job.sh [args]`` runs ``bash -c TEXT job.sh args`` (the text travels
    with the job, as Slurm stores the batch script). Without a name (``-J``, ``#SBATCH
    --job-name``) a script's job is named after the script, as Slurm's; with
    ``batch_file`` (``submit``, as sbatch) and no ``--output``, its output goes to
    Slurm's ``slurm-%j.out`` (``slurm-%A_%a.out`` for an array) as well as to
    ``gpufleet logs``. Exits 2 on a bad value, a missing script, or an option gpufleet
    cannot honour (unless ``--ignore-unsupported``: then a warning for each)."""
    now = time.time()
    try:
        script = batch.script_of(args)
    except batch.NoScript as exc:
        raise fail(str(exc), BAD_INPUT) from None
    opts, command = slurmflags.SbatchOptions(), list(args)
    if script is not None:
        opts = sbatch.parse_script(script.text, source=args[0], now=now)
        own = gpufleet_directives.parse(script.text, source=args[0])  # ``#GPUFLEET`` lines
        mine = [p for p in own.problems if not (flags.get("checkpoint_every") and p.option)]
        opts = dataclasses.replace(
            opts,
            checkpoint_every=own.checkpoint_every,
            problems=(*opts.problems, *mine),
            origins=(*opts.origins, *own.origins),
        )
        command = [*sbatch.SCRIPT_SHELL, script.text, script.path.name, *args[1:]]
    opts = batch.from_flags(opts, flags, now=now)
    if script is not None and opts.name is None:
        opts = dataclasses.replace(opts, name=script.path.name)
    if script is not None and batch_file and opts.output is None:
        default = "slurm-%j.out" if opts.array is None else "slurm-%A_%a.out"
        opts = dataclasses.replace(opts, output=default)
    _judge(opts.problems, ignore=bool(flags.get("ignore_unsupported")))
    return opts, command


def _judge(problems: Sequence[sbatch.Problem], *, ignore: bool) -> None:
    """Exit 2 on any bad value, and on any refused option unless ``ignore``."""
    refused = [p for p in problems if p.refused]
    if ignore:
        for p in refused:
            warn(f"{p} (ignored: --ignore-unsupported)")
    stops = [p for p in problems if not p.refused or not ignore]
    if stops:
        raise _stop(stops)


def _stop(problems: Sequence[sbatch.Problem]) -> typer.Exit:
    """Print each problem; returns the exit (2) to raise."""
    for p in problems:
        error(str(p))
    if any(p.refused for p in problems):
        error("nothing submitted; --ignore-unsupported submits without what gpufleet cannot honour")
    return typer.Exit(BAD_INPUT)


_FIELD_OPTION = {
    "array": "array",
    "dependency": "dependency",
    "begin": "begin",
    "deadline": "deadline",
    "signal": "signal",
    "checkpoint_every": "checkpoint-every",
    "time_limit": "time",
    "pool": "partition",
    "reservation": "reservation",
}
"""The API's field in a 422's words -> the option that gave it (to name its script line)."""


def _submitted(
    c: GpufleetClient,
    opts: slurmflags.SbatchOptions,
    command: list[str],
    flags: dict[str, Any],
    *,
    every_node: bool = False,
) -> dict[str, Any]:
    """Submit; a refusal of a value that came from a script names the script's line. The
    job as the server's JSON (``JobDetail``'s fields): printed, not reasoned on, so that
    ``gpufleet submit`` never imports pydantic and the API's models (~60 ms).
    ``every_node``: the command runs on every node of a multi-node job, as ``srun``
    outside an allocation (``gpufleet run``); else once, on the first (a batch script's
    way; the agent's ``steps.EVERY_NODE_ENV``)."""
    try:
        spec, warnings = batch.job_spec(c, opts, command, flags, environ=os.environ, cwd=os.getcwd())
    except batch.Unhonoured as exc:
        raise _stop([sbatch.Problem(where="", text=str(exc), refused=exc.refused)]) from None
    if every_node:
        spec["env"] = {**(spec.get("env") or {}), "GPUFLEET_EVERY_NODE": "1"}
    for w in warnings:
        warn(w)
    try:
        submitted = c.request("POST", "/jobs", json=spec)
    except ClientError as exc:
        field, _, rest = (exc.detail or "").partition(": ")
        option = _FIELD_OPTION.get(field)
        where = next((w for name, w in opts.origins if name == option), None) if option else None
        if exc.status == 422 and where is not None:
            raise fail(f"{where}: {rest}", BAD_INPUT) from None
        raise
    if not isinstance(submitted, dict) or not isinstance(submitted.get("id"), int):
        raise ClientError(f"unexpected answer from {c.url}/v1/jobs: not a job")
    return submitted


@batch.with_job_flags
def submit(
    args: list[str] = typer.Argument(..., help="-- COMMAND... or a #SBATCH script [ARGS]"),
    parsable: bool = flag(
        "--parsable", help="Print only the job's id (an array's id), as sbatch --parsable."
    ),
    json_out: bool = json_flag("its id"),
    **flags: Any,
) -> None:
    """Submit a job; prints its id. Options override #SBATCH directives.

    Every #SBATCH directive is honoured with Slurm's meaning, accepted as harmless
    (--mail-type...), or refused with why (exit 2; --ignore-unsupported submits
    without it). A batch script or an array prints `Submitted batch job ID`, as
    sbatch; a command (`-- CMD`) its id alone, as --parsable does."""
    opts, command = _options(args, flags, batch_file=True)
    with client() as c:
        job = _submitted(c, opts, command, flags)
        for w in job.get("warnings") or ():
            warn(w)
        if json_out:
            print_json(job)
            return
        typer.echo(submitted_line(job, script=sbatch.BatchScript.of(command) is not None, parsable=parsable))
        with contextlib.suppress(ClientError):  # the job is in: a price is a courtesy
            for line in price_hint(c, job):
                typer.echo(f"gpufleet: {line}", err=True)


def submitted_line(job: dict[str, Any], *, script: bool, parsable: bool) -> str:
    """What ``submit`` prints (issue 31, item 9): sbatch's ``Submitted batch job N`` for a
    batch script or an array, so that ``sbatch job.sh | awk '{print $4}'`` works with
    gpufleet's ``sbatch`` and with ``gpufleet submit`` alike; the id alone for one job
    of a command (``JOB=$(gpufleet submit -- cmd)``, gpufleet's own form that no sbatch
    script uses) and with ``--parsable`` (sbatch's, for ``JOB=$(sbatch --parsable
    job.sh)``). An array's id is its first task's, as Slurm's."""
    array = job.get("array_job_id")
    number = array if array is not None else job["id"]
    if parsable or (array is None and not script):
        return str(number)
    return f"Submitted batch job {number}"


def price_hint(c: GpufleetClient, job: dict[str, Any]) -> list[str]:
    """What a just-submitted job costs per hour now and when it would be cheaper
    (``gpufleet submit`` prints it: work that can wait may be held and released
    off-peak). Empty when no prices are set. The models are those the job could get:
    the fleet's that match its ``gpu_type`` as the scheduler matches them (all the
    schedule's, before any node registered)."""
    n, wanted = job["gpus"], job.get("gpu_type")
    if n == 0:
        return []
    out = c.request("GET", "/prices")  # PricesOut's JSON (no pydantic: see _submitted)
    if not isinstance(out, dict) or out.get("schedule") is None:
        return []
    from gpufleet.gpumatch import gpu_type_matches  # the scheduler's rule, not the scheduler

    zone = local_zone()
    rows = [p for p in out.get("prices") or () if not wanted or gpu_type_matches(wanted, p["gpu_type"])]
    rows = [p for p in rows if p.get("in_fleet")] or rows
    gpus = words.count(n, "GPU")
    lines = []
    for p in rows[:4]:
        price = float(p["price"])
        line = f"{p['gpu_type']} costs {price:.4g}/GPU-hour now ({gpus}: {price * n:.4g}/h)"
        at, cheaper = p.get("next_cheaper_at"), p.get("next_cheaper_price")
        if at is not None and cheaper is not None:
            line += f"; {cheaper:.4g} from {show_time(at, zone)}"
        lines.append(line)
    return lines


@batch.with_job_flags
def run(
    args: list[str] = typer.Argument(..., help="-- COMMAND... (or a #SBATCH script [ARGS])"),
    **flags: Any,
) -> None:
    """Run a job and wait for it, like srun: prints its output as it comes and exits
    with its exit code.

    Takes submit's flags. A failed job exits with its code, a cancelled or timed-out one
    with 1. Ctrl-C cancels the job and waits for it to end; a second Ctrl-C stops
    waiting (the job is still cancelled)."""
    opts, command = _options(args, flags, batch_file=False)
    if opts.array is not None:
        raise fail("--array: run waits for one job; submit an array with gpufleet submit", BAD_INPUT)
    with client() as c:
        job = _submitted(c, opts, command, flags, every_node=True)  # srun's way: on every node
        for w in job.get("warnings") or ():
            warn(w)
        typer.echo(f"gpufleet: job {job['id']} queued", err=True)
        _follow(job["id"])
        raise typer.Exit(_outcome(_ended(c, job["id"])))


def _follow(job_id: int) -> None:
    """Print the job's output until it is over. The first Ctrl-C cancels the job (in the
    background: the output goes on to the end); a second stops waiting (exit 130)."""
    asked = threading.Event()

    def interrupted(signum: int, frame: object) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()
        typer.echo(f"\ngpufleet: cancelling job {job_id} (Ctrl-C again to stop waiting)", err=True)
        threading.Thread(target=_cancel, args=(job_id,), daemon=True).start()

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        stream_logs(job_id, follow=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def _cancel(job_id: int) -> None:
    try:
        with GpufleetClient.from_env() as c:
            c.cancel_many({"ids": [job_id]})
    except ClientError as exc:
        error(f"job {job_id} not cancelled: {exc.message}")


_OVER = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def _ended(c: GpufleetClient, job_id: int, *, poll_s: float = 0.5) -> JobOut:
    """The job once over (the output stream ends then, or when the connection does)."""
    while True:
        job = c.job(job_id)
        if job.state in _OVER:
            return job
        time.sleep(poll_s)


def _outcome(job: JobOut) -> int:
    """srun's exit code: the job's own, or 1 when it ended without one."""
    if job.state == "COMPLETED":
        return 0
    if job.state == "FAILED":
        code = job.exit_code
        return code if code is not None and 0 < code < 256 else FAILED
    why = "hit its time limit" if job.state == "TIMEOUT" else "was cancelled"
    error(f"job {job.id} {why} ({job.state})")
    return FAILED
