"""``gpufleet history``'s columns, named and written as ``sacct`` writes them, so that
its ``--parsable2`` output reads back with the simulator's sacct loader
(``sim/loaders/sacct.py``): a site replays its own past in one command.

Times are local and naive (``2026-03-01T14:05:00``, sacct's form); a job that never
started has Start ``None`` and one still running End ``Unknown``; durations are
``[D-]HH:MM:SS``; ``Timelimit`` is ``UNLIMITED`` when none was set. ``AllocTRES`` is
empty until a job was placed, then its CPUs, memory, nodes and GPUs (``gres/gpu=4``,
and ``gres/gpu:TYPE=4`` for a typed request, as Slurm lists both); ``ReqTRES`` says
the same of the request. States are Slurm's (``slurmnames.slurm_state``).

A job is the server's JSON (``GET /v1/jobs``: ``JobOut``'s fields), read as it comes, not
validated as a ``JobOut``: importing the API's models and validating every job was
~100 ms of ``sacct``, a command scripts run in a loop (issue 31).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpufleet.cli import slurmnames

Job = Mapping[str, Any]
"""A job as the server's JSON (``JobOut``'s fields)."""

DEFAULT_FORMAT = "JobID,JobName,User,Partition,Account,State,Start,Elapsed,AllocTRES,ExitCode"


def clock(ts: float | None, *, none: str) -> str:
    """sacct's time: local, naive, to the second; ``none`` when there is none."""
    if ts is None:
        return none
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def duration(seconds: float | None) -> str:
    """``[D-]HH:MM:SS``, as sacct writes Elapsed and Timelimit."""
    if seconds is None:
        return "UNLIMITED"
    s = max(0, round(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{s:02d}"


def start_of(job: Job) -> float | None:
    """When it got its resources (Slurm's Start): started, else placed."""
    at = job["started_at"] if job["started_at"] is not None else job["scheduled_at"]
    return None if at is None else float(at)


def elapsed_s(job: Job, now: float) -> float:
    start = start_of(job)
    if start is None:
        return 0.0
    return max(0.0, (job["ended_at"] if job["ended_at"] is not None else now) - start)


def node_count(job: Job) -> int:
    """Nodes asked for; when the scheduler chose, those it holds (else 1)."""
    return job["nodes"] or max(1, len(job["allocation"]))


def tres(job: Job) -> str:
    """The job's trackable resources in Slurm's words (``ReqTRES``/``AllocTRES``)."""
    nodes = node_count(job)
    parts = []
    cpus, gpus, gpu_type, mem = (
        job.get("cpus_per_node", 0),
        job["gpus"],
        job["gpu_type"],
        job.get("mem_per_node_mb", 0),
    )
    if cpus:
        parts.append(f"cpu={cpus * nodes}")
    if gpus:
        parts.append(f"gres/gpu={gpus}")
        if gpu_type:
            parts.append(f"gres/gpu:{gpu_type.lower()}={gpus}")
    if mem:
        parts.append(f"mem={mem * nodes}M")
    parts.append(f"node={nodes}")
    return ",".join(parts)


def exit_code(job: Job) -> str:
    """``code:signal``: gpufleet records a code; a job that never ran has ``0:0``."""
    code = job["exit_code"]
    return f"{code if code is not None else 0}:0"


def reason(job: Job) -> str:
    return (job.get("wait_reason") or "None").split(":", 1)[0]


Field = Callable[[Job, float], object]
FIELDS: dict[str, Field] = {
    "JobID": lambda j, now: slurmnames.job_id(j["id"], j.get("array_job_id"), j.get("array_task_id")),
    "JobIDRaw": lambda j, now: j["id"],
    "JobName": lambda j, now: j["name"],
    "User": lambda j, now: j["user"],
    "Account": lambda j, now: j["team"],
    "Partition": lambda j, now: j["pool"],
    "Submit": lambda j, now: clock(j["submit_time"], none="Unknown"),
    "Eligible": lambda j, now: clock(max(j["submit_time"], j.get("begin_at") or 0.0), none="Unknown"),
    "Start": lambda j, now: clock(start_of(j), none="None"),
    "End": lambda j, now: clock(j["ended_at"], none="Unknown"),
    "Elapsed": lambda j, now: duration(elapsed_s(j, now)),
    "ElapsedRaw": lambda j, now: round(elapsed_s(j, now)),
    "Timelimit": lambda j, now: duration(j["time_limit_s"]),
    "TimelimitRaw": lambda j, now: (
        "UNLIMITED" if j["time_limit_s"] is None else round(j["time_limit_s"] / 60)
    ),
    "AllocTRES": lambda j, now: tres(j) if start_of(j) is not None else "",
    "ReqTRES": lambda j, now: tres(j),
    "AllocCPUS": lambda j, now: j.get("cpus_per_node", 0) * node_count(j) if start_of(j) is not None else 0,
    "ReqCPUS": lambda j, now: j.get("cpus_per_node", 0) * node_count(j),
    "ReqMem": lambda j, now: f"{j.get('mem_per_node_mb', 0)}M" if j.get("mem_per_node_mb", 0) else "0",
    "NNodes": lambda j, now: node_count(j),
    "NodeList": lambda j, now: ",".join(a["node"] for a in j["allocation"]) or "None assigned",
    "State": lambda j, now: slurmnames.slurm_state(j["state"]),
    "ExitCode": lambda j, now: exit_code(j),
    "Priority": lambda j, now: j["priority"],
    "Reason": lambda j, now: reason(j),
    "Dependency": lambda j, now: j.get("dependency") or "",
}
"""Every column ``--format`` takes (any case), as sacct names it."""
_BY_LOWER = {name.lower(): name for name in FIELDS}


def columns(spec: str) -> list[tuple[str, int | None]]:
    """(field, width or None) of ``--format=JobID,JobName%30,...``; raises ValueError
    naming an unknown field and the ones there are."""
    out: list[tuple[str, int | None]] = []
    for raw in (x.strip() for x in spec.split(",") if x.strip()):
        name, pct, width = raw.partition("%")
        field = _BY_LOWER.get(name.lower())
        if field is None:
            raise ValueError(f"--format: no field {name} (fields: {', '.join(FIELDS)})")
        if pct and not width.isdigit():
            raise ValueError(f"--format: {raw}: the width after % is a number")
        out.append((field, int(width) if pct else None))
    if not out:
        raise ValueError("--format: name at least one field")
    return out


def rows(jobs: Sequence[Job], cols: Sequence[tuple[str, int | None]], *, now: float) -> list[list[str]]:
    """The cells of each job, a too-wide one cut to its width with ``+`` at the end, as
    sacct marks it."""
    out = []
    for j in jobs:
        row = []
        for name, width in cols:
            cell = str(FIELDS[name](j, now))
            if width is not None and len(cell) > width:
                cell = cell[: max(0, width - 1)] + "+"
            row.append(cell)
        out.append(row)
    return out


def parsable(
    jobs: Sequence[Job],
    cols: Sequence[tuple[str, int | None]],
    *,
    now: float,
    trailing: bool,
    header: bool,
) -> list[str]:
    """``--parsable2`` lines (``|`` between fields, header first), or ``--parsable``'s
    (a ``|`` after the last field too). A ``|`` in a value would split it: it becomes
    ``/``, as no name gpufleet stores should hold one."""
    end = "|" if trailing else ""
    lines = ["|".join(name for name, _ in cols) + end] if header else []
    for row in rows(jobs, [(name, None) for name, _ in cols], now=now):
        lines.append("|".join(cell.replace("|", "/") for cell in row) + end)
    return lines


__all__ = ["DEFAULT_FORMAT", "FIELDS", "clock", "columns", "duration", "parsable", "rows", "tres"]
