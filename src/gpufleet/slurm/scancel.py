"""``scancel``: cancel jobs by id (``123``: a job, or every task of array 123; ``123_4``,
``123_[1-3]``: tasks), or every job of yours the filters match (``-u``, ``-n``, ``-t``,
``-p``, ``--me``); with ids, the filters narrow them. Silent on success, as Slurm's.

Errors are Slurm's lines, one per job, and exit 1: ``scancel: error: Kill job error on
job id 123: Invalid job id specified`` (not there, or not yours: the server does not
say which), ``...: Job/step already completing or completed``. ``-s/--signal`` other
than KILL/TERM/INT is refused (gpufleet cancels; it does not relay signals).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from gpufleet.slurm._common import SlurmError, connect, run, wanted_states

if TYPE_CHECKING:
    from gpufleet.client import GpufleetClient

PROG = "scancel"
_REF = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]+\]))?$")
INVALID = "Invalid job id specified"
ENDED = "Job/step already completing or completed"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Cancel jobs.")
    p.add_argument("ids", nargs="*", help="123, 123_4, 123_[1-3]")
    p.add_argument("-u", "--user", help="Only this user's jobs (others': operators).")
    p.add_argument(
        "--me", action="store_true", help="Only your jobs (they are all gpufleet lets you cancel)."
    )
    p.add_argument("-n", "--name", "--jobname", help="Only jobs of this name.")
    p.add_argument("-t", "--state", action="append", default=[], help="Only jobs in these states (PD, R...).")
    p.add_argument("-p", "--partition", help="Only jobs of this pool.")
    p.add_argument("-s", "--signal", help="Accepted: KILL, TERM, INT (gpufleet cancels the job).")
    p.add_argument("-b", "--batch", action="store_true", help="Accepted: the whole job is cancelled.")
    p.add_argument("-f", "--full", action="store_true", help="Accepted: the whole job is cancelled.")
    p.add_argument("-Q", "--quiet", action="store_true", help="No error lines (the exit code still says).")
    p.add_argument("-v", "--verbose", action="store_true", help="Accepted.")
    return p


def parse_ref(text: str) -> tuple[int, tuple[int, ...] | None]:
    """(job, tasks or None) of ``123``, ``123_4``, ``123_[1-3,7]``; ValueError."""
    from gpufleet.arrayspec import parse_array

    m = _REF.match(text.strip())
    if m is None:
        raise ValueError(text)
    job, tasks = int(m.group(1)), m.group(2)
    if tasks is None:
        return job, None
    if tasks.isdigit():
        return job, (int(tasks),)
    return job, parse_array(tasks[1:-1]).indices


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return run(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    from gpufleet.client import BULK_TIMEOUT_S  # a whole array's cancel waits for its answer

    if args.signal and args.signal.upper().removeprefix("SIG") not in ("KILL", "TERM", "INT", "9", "15", "2"):
        raise SlurmError(
            f"--signal={args.signal}: gpufleet cancels jobs; it does not send them other signals"
        )
    states = wanted_states(args.state) if args.state else []
    filters: dict[str, Any] = {"user": args.user, "name": args.name, "states": states or None}
    filters = {k: v for k, v in filters.items() if v is not None}
    if not args.ids and not filters and not args.me and not args.partition:
        raise SlurmError("No job identification provided")
    errors: list[str] = []
    with connect() as c:
        if args.partition:
            filters = _with_pool(c, filters, args.partition, args.ids)
            if filters.get("ids") == []:
                return 0
        if not args.ids:
            c.request("POST", "/jobs/cancel", json=filters, timeout=BULK_TIMEOUT_S)
        for given in args.ids:
            errors += _cancel(c, given, filters)
    if not args.quiet:
        sys.stderr.write("".join(f"{PROG}: error: {e}\n" for e in errors))
    return 1 if errors else 0


def _with_pool(c: GpufleetClient, filters: dict[str, Any], pool: str, given: list[str]) -> dict[str, Any]:
    """The API's filters have no pool: the ids of the matching jobs in it instead."""
    listing = c.job_listing(
        states=filters.get("states") or ["PENDING", "HELD", "SCHEDULED", "RUNNING"], pool=pool
    )
    ids = [int(j["id"]) for j in listing]
    if given:  # `scancel -p gpu 123`: 123 only if it is in the pool
        return filters | {"pool_ids": ids}
    return {k: v for k, v in filters.items() if k != "states"} | {"ids": ids}


def _cancel(c: GpufleetClient, given: str, filters: dict[str, Any]) -> list[str]:
    """Cancel one id of the command line; the error lines."""
    from gpufleet.client import BULK_TIMEOUT_S, ClientError

    try:
        job_id, tasks = parse_ref(given)
    except ValueError:
        return [f"Invalid job id {given}"]
    in_pool = filters.get("pool_ids")
    api = {k: v for k, v in filters.items() if k != "pool_ids"}
    if tasks is not None:
        by_task = {int(t["array_task_id"]): int(t["id"]) for t in c.job_listing(array=job_id)}
        ids = [by_task[t] for t in tasks if t in by_task]
        errors = [f"Kill job error on job id {job_id}_{t}: {INVALID}" for t in tasks if t not in by_task]
        if in_pool is not None:
            ids = [i for i in ids if i in in_pool]
        if ids:
            c.request("POST", "/jobs/cancel", json=api | {"ids": ids}, timeout=BULK_TIMEOUT_S)
        return errors
    try:
        job = c.request("GET", f"/jobs/{job_id}")
    except ClientError as exc:
        if exc.status in (403, 404):
            return [f"Kill job error on job id {given}: {INVALID}"]
        raise
    if in_pool is not None and job_id not in in_pool and job.get("array_job_id") != job_id:
        return []
    body = api | ({"array": job_id} if job.get("array_job_id") == job_id else {"ids": [job_id]})
    out = c.request("POST", "/jobs/cancel", json=body, timeout=BULK_TIMEOUT_S)
    if not api and not out.get("cancelled") and not out.get("skipped"):
        return [f"Kill job error on job id {given}: {ENDED}"]
    return []


__all__ = ["main", "parse_ref"]
