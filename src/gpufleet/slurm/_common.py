"""What the Slurm commands share: the connection (as ``gpufleet.client`` reads it:
``GPUFLEET_URL``, ``GPUFLEET_TOKEN``, ``GPUFLEET_CA_FILE``, else ``gpufleet login``'s
file), Slurm's error lines (``squeue: error: ...``), Slurm's names for states and
its ways of writing times.

Nothing here imports ``gpufleet.cli`` (whose package imports Typer, ~35 ms), the API's
pydantic models (~60-100 ms) or httpx (~25-30 ms): these commands read the server's JSON
as it comes, as ``gpufleet queue`` does, because a job calls them at every task start.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.client import GpufleetClient


class SlurmError(Exception):
    """Ends a command with ``PROG: error: MESSAGE`` and ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def connect() -> GpufleetClient:
    """A client for the connection the environment or ``gpufleet login`` gives, on the
    standard library's HTTP (``gpufleet.litehttp``: no httpx imported), as ``gpufleet``'s
    own commands (``cli/_common.client``)."""
    from gpufleet.client import ClientError, GpufleetClient, load_connection
    from gpufleet.failover import parse_urls

    conn = load_connection()
    try:
        urls = parse_urls(conn.url)
    except ValueError as exc:
        raise ClientError(f"server URL: {exc}") from None
    return GpufleetClient(urls, conn.token, ca_file=conn.ca_file)


def run(prog: str, body: Callable[[], int]) -> int:
    """``body()``'s exit code; a :class:`SlurmError` or a client error is one line on
    stderr (``prog: error: ...``) and exit 1 (Slurm's commands exit 1 on any error)."""
    from gpufleet.client import ClientError

    try:
        return body()
    except SlurmError as exc:
        error(prog, exc.message)
        return exc.code
    except ClientError as exc:
        error(prog, exc.message)
        return 1


def error(prog: str, message: str) -> None:
    sys.stderr.write(f"{prog}: error: {message}\n")


SHORT_STATE = {
    "PENDING": "PD",
    "RUNNING": "R",
    "COMPLETING": "CG",
    "COMPLETED": "CD",
    "CONFIGURING": "CF",
    "FAILED": "F",
    "CANCELLED": "CA",
    "TIMEOUT": "TO",
    "NODE_FAIL": "NF",
    "PREEMPTED": "PR",
    "SUSPENDED": "S",
    "REQUEUED": "RQ",
    "OUT_OF_MEMORY": "OOM",
}
"""Slurm's state codes (``squeue -t``, ``%t``)."""
_GPUFLEET = {
    "PENDING": ("PENDING", "HELD"),
    "RUNNING": ("SCHEDULED", "RUNNING"),
    "COMPLETED": ("COMPLETED",),
    "FAILED": ("FAILED",),
    "CANCELLED": ("CANCELLED",),
    "TIMEOUT": ("TIMEOUT",),
}
"""Slurm's states that gpufleet's jobs rest in, as gpufleet's states (HELD is Slurm's
PENDING with reason JobHeldUser; SCHEDULED, placed and starting, is RUNNING)."""
ACTIVE = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")
"""What ``squeue`` lists without ``-t``."""


def slurm_state(state: str) -> str:
    return {"HELD": "PENDING", "SCHEDULED": "RUNNING"}.get(state, state)


def wanted_states(given: Iterable[str]) -> list[str]:
    """gpufleet's states for Slurm's state names or codes (any case, comma lists;
    ``all``); a state gpufleet's jobs never rest in (SUSPENDED, CG...) selects nothing.
    Raises SlurmError naming an unknown one, as Slurm does."""
    by_code = {code: name for name, code in SHORT_STATE.items()}
    out: list[str] = []
    for raw in given:
        for word in (w.strip().upper() for w in raw.split(",") if w.strip()):
            if word == "ALL":
                return [s for states in _GPUFLEET.values() for s in states]
            name = by_code.get(word, word)
            if name not in SHORT_STATE:
                raise SlurmError(f"Invalid job state specified: {word}")
            out += [s for s in _GPUFLEET.get(name, ()) if s not in out]
    return out


def elapsed(seconds: float | None) -> str:
    """squeue's ``TIME``/``TIME_LIMIT``: ``M:SS``, ``MM:SS``, ``H:MM:SS``,
    ``D-HH:MM:SS``; ``UNLIMITED`` for None."""
    if seconds is None:
        return "UNLIMITED"
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"


def clock_time(seconds: float | None) -> str:
    """scontrol's ``RunTime``/``TimeLimit``: ``HH:MM:SS`` or ``D-HH:MM:SS``;
    ``UNLIMITED`` for None."""
    if seconds is None:
        return "UNLIMITED"
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    return (f"{days}-" if days else "") + f"{hours:02d}:{minutes:02d}:{s:02d}"


def timestamp(at: float | None, *, none: str = "N/A") -> str:
    """Slurm's local time, ``2026-03-01T14:05:00``."""
    return none if at is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at))


def job_label(job: dict[str, Any]) -> str:
    """``123``, or ``123_4`` for task 4 of array 123, or ``123_[5-99]`` for the waiting
    tasks a folded listing item stands for (``array_tasks``)."""
    array, task = job.get("array_job_id"), job.get("array_task_id")
    if array is None or task is None:
        return str(job["id"])
    return f"{array}_{task_label(job)}"


def task_label(job: dict[str, Any]) -> str:
    """An array task's index as squeue writes it: ``4``, or ``[5-99]`` for a folded
    item's tasks (Slurm's ``%K``/ArrayTaskID of a pending array record)."""
    tasks, count = job.get("array_tasks"), job.get("array_task_count")
    if tasks is None:
        return str(job.get("array_task_id"))
    return str(tasks) if count == 1 else f"[{tasks}]"


def started(job: dict[str, Any]) -> float | None:
    """When it got its nodes (Slurm's StartTime): started, else placed."""
    at = job.get("started_at")
    return at if at is not None else job.get("scheduled_at")


def run_time(job: dict[str, Any], now: float) -> float:
    start = started(job)
    if start is None:
        return 0.0
    end = job.get("ended_at")
    return max(0.0, (end if end is not None else now) - start)


def node_names(job: dict[str, Any]) -> list[str]:
    return [str(a["node"]) for a in job.get("allocation") or ()]


def reason(job: dict[str, Any]) -> str:
    """Slurm's reason word (``Priority``, ``Resources``, ``JobHeldUser``...), without
    gpufleet's detail after the colon; ``None`` when there is none."""
    why = job.get("wait_reason")
    return str(why).split(":", 1)[0].strip() or "None" if why else "None"


__all__ = [
    "ACTIVE",
    "SHORT_STATE",
    "SlurmError",
    "clock_time",
    "connect",
    "elapsed",
    "error",
    "job_label",
    "node_names",
    "reason",
    "run",
    "run_time",
    "slurm_state",
    "started",
    "task_label",
    "timestamp",
    "wanted_states",
]
