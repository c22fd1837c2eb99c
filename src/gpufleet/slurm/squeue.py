"""``squeue``: waiting and running jobs in Slurm's columns.

Slurm's default format (``%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R``), ``-o/--format``
with the letters scripts use (``FORMATS``), widths as Slurm reads them (``%.18i``:
right-aligned in 18, ``%-10j``/``%10j``: left-aligned; a longer value is cut to the
width), ``-h/--noheader``, ``-u USER[,USER]``/``--me``, ``-j ID[,ID]`` (``123`` an
array's every task, ``123_4`` one), ``-t STATES`` (``PD,R``, ``all``), ``-p POOLS``,
``-n NAMES``. An array's tasks that wait in one state are one row, ``123_[5-99]``, as
Slurm's squeue shows a pending array (the server folds them: a 10,000-task array is one
item, not 10,000); ``-r/--array`` shows one row a task (``123_5``), and so does ``-j``
(which names jobs and tasks one by one).

Which jobs a user sees is the server's rule (users: their own; operators: all).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from gpufleet.slurm import hostlist
from gpufleet.slurm._common import (
    SHORT_STATE,
    SlurmError,
    connect,
    elapsed,
    job_label,
    node_names,
    reason,
    run,
    run_time,
    slurm_state,
    started,
    task_label,
    timestamp,
    wanted_states,
)

PROG = "squeue"
DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"

Field = Callable[[dict[str, Any], float], object]


def _nodelist(job: dict[str, Any], now: float) -> str:
    return hostlist.compress(node_names(job))


def _where(job: dict[str, Any], now: float) -> str:
    """``%R``: the nodes of a job that has them, else ``(Reason)``."""
    nodes = node_names(job)
    return hostlist.compress(nodes) if nodes else f"({reason(job)})"


def _num_nodes(job: dict[str, Any]) -> int:
    return len(node_names(job)) or int(job.get("nodes") or 1)


def _cpus(job: dict[str, Any], now: float) -> int:
    nodes = _num_nodes(job)
    return int(job.get("cpus_per_node") or 0) * nodes or nodes


def _tres_per_node(job: dict[str, Any], now: float) -> str:
    per_node = int(job.get("gpus_per_node") or 0)
    if not per_node and job.get("gpus"):
        per_node = int(job["gpus"]) // _num_nodes(job) or int(job["gpus"])
    return f"gres/gpu:{per_node}" if per_node else "N/A"


def _end(job: dict[str, Any], now: float) -> str:
    end = job.get("ended_at")
    start, limit = started(job), job.get("time_limit_s")
    if end is None and start is not None and limit is not None:
        end = start + float(limit)
    return timestamp(end)


FORMATS: dict[str, tuple[str, Field]] = {
    "i": ("JOBID", lambda j, now: job_label(j)),
    "A": ("ARRAY_JOB_ID", lambda j, now: j.get("array_job_id") or j["id"]),
    "a": ("ARRAY_TASK_ID", lambda j, now: "N/A" if j.get("array_task_id") is None else task_label(j)),
    "j": ("NAME", lambda j, now: j.get("name") or ""),
    "u": ("USER", lambda j, now: j.get("user") or ""),
    "a_": ("ACCOUNT", lambda j, now: j.get("team") or ""),
    "T": ("STATE", lambda j, now: slurm_state(str(j["state"]))),
    "t": ("ST", lambda j, now: SHORT_STATE.get(slurm_state(str(j["state"])), "?")),
    "M": ("TIME", lambda j, now: elapsed(run_time(j, now))),
    "l": ("TIME_LIMIT", lambda j, now: elapsed(j.get("time_limit_s"))),
    "D": ("NODES", lambda j, now: _num_nodes(j)),
    "R": ("NODELIST(REASON)", _where),
    "N": ("NODELIST", _nodelist),
    "P": ("PARTITION", lambda j, now: j.get("pool") or ""),
    "C": ("CPUS", _cpus),
    "b": ("TRES_PER_NODE", _tres_per_node),
    "Q": ("PRIORITY", lambda j, now: j.get("priority", 0)),
    "V": ("SUBMIT_TIME", lambda j, now: timestamp(j.get("submit_time"))),
    "S": ("START_TIME", lambda j, now: timestamp(started(j) or j.get("estimated_start"))),
    "e": ("END_TIME", _end),
    "r": ("REASON", lambda j, now: reason(j)),
    "E": ("DEPENDENCY", lambda j, now: j.get("dependency") or "(null)"),
    "q": ("QOS", lambda j, now: "normal"),
    "m": ("MIN_MEMORY", lambda j, now: f"{j.get('mem_per_node_mb') or 0}M"),
    "Z": ("WORK_DIR", lambda j, now: j.get("workdir") or j.get("submit_dir") or ""),
}
"""``-o`` letters: Slurm's header and the value (``a_``: ``%a`` is the array task, so
the account is ``-O Account`` only)."""
_LONG = {
    "jobid": "i",
    "arrayjobid": "A",
    "arraytaskid": "a",
    "name": "j",
    "username": "u",
    "account": "a_",
    "state": "T",
    "statecompact": "t",
    "timeused": "M",
    "timelimit": "l",
    "numnodes": "D",
    "reasonlist": "R",
    "nodelist": "N",
    "partition": "P",
    "numcpus": "C",
    "tres-per-node": "b",
    "priority": "Q",
    "submittime": "V",
    "starttime": "S",
    "endtime": "e",
    "reason": "r",
    "dependency": "E",
    "qos": "q",
    "minmemory": "m",
    "workdir": "Z",
}
"""``-O/--Format`` names (any case) -> the letter."""

_SPEC = re.compile(r"%(\.)?(-)?(\d+)?([a-zA-Z%])")

Column = tuple[str, str, int | None, bool]
"""(literal text before it, letter, width, right-aligned)."""


def parse_format(spec: str) -> tuple[list[Column], str]:
    """The columns of ``-o SPEC`` and the text after the last one; raises SlurmError
    for a letter gpufleet does not know (with the ones it does)."""
    cols: list[Column] = []
    pos = 0
    text = ""
    for m in _SPEC.finditer(spec):
        text += spec[pos : m.start()]
        pos = m.end()
        letter = m.group(4)
        if letter == "%":
            text += "%"
            continue
        if letter not in FORMATS:
            known = "".join(k for k in FORMATS if len(k) == 1)
            raise SlurmError(f"Invalid job format specification: {letter} (gpufleet knows %[{known}])")
        width = int(m.group(3)) if m.group(3) else None
        cols.append((text, letter, width, bool(m.group(1))))
        text = ""
    return cols, text + spec[pos:]


def parse_long_format(spec: str) -> tuple[list[Column], str]:
    """``-O jobid:10,name,state:.8``: Slurm's ``-O`` fields (``:[.]WIDTH``), a space after
    each; default width 20."""
    cols: list[Column] = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        name, _, size = item.partition(":")
        letter = _LONG.get(name.lower())
        if letter is None:
            raise SlurmError(f"Invalid job format specification: {name}")
        right = size.startswith(".")
        digits = size.lstrip(".")
        width = int(digits) if digits.isdigit() else 20
        cols.append(("" if not cols else " ", letter, width, right))
    return cols, " "


def _cell(value: object, width: int | None, right: bool) -> str:
    text = str(value)
    if width is None:
        return text
    text = text[:width]
    return text.rjust(width) if right else text.ljust(width)


def render(
    jobs: list[dict[str, Any]], cols: list[Column], tail: str, *, header: bool, now: float
) -> list[str]:
    lines: list[str] = []
    rows: list[list[object]] = [[FORMATS[c[1]][0] for c in cols]] if header else []
    rows += [[FORMATS[c[1]][1](j, now) for c in cols] for j in jobs]
    for row in rows:
        parts = [f"{lit}{_cell(v, w, right)}" for (lit, _, w, right), v in zip(cols, row, strict=True)]
        lines.append(("".join(parts) + tail).rstrip())
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, add_help=False, description="Waiting and running jobs.")
    p.add_argument("--help", action="help", help="Show this help.")
    p.add_argument("-h", "--noheader", action="store_true", help="No header line.")
    p.add_argument(
        "-o", "--format", help=f"Columns, Slurm's letters (default: {DEFAULT_FORMAT.replace('%', '%%')})."
    )
    p.add_argument("-O", "--Format", dest="long_format", help="Columns by name: jobid,name:30,state.")
    p.add_argument("-u", "--user", action="append", default=[], help="These users' jobs (comma list).")
    p.add_argument("--me", action="store_true", help="Your own jobs.")
    p.add_argument("-j", "--jobs", action="append", default=[], help="These jobs: 123, 123_4 (comma list).")
    p.add_argument("-t", "--states", action="append", default=[], help="PD,R,CD... or all.")
    p.add_argument("-p", "--partition", action="append", default=[], help="These pools (comma list).")
    p.add_argument("-n", "--name", action="append", default=[], help="Jobs of these names (comma list).")
    p.add_argument("-a", "--all", action="store_true", help="Accepted: every pool is shown already.")
    p.add_argument("-r", "--array", action="store_true", help="One line a task (default: 123_[5-99]).")
    p.add_argument("-l", "--long", action="store_true", help="Slurm's long format.")
    return p


def _csv(values: list[str]) -> list[str]:
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def _matches(job: dict[str, Any], refs: list[str]) -> bool:
    label = job_label(job)
    ids = {str(job["id"]), label, str(job.get("array_job_id") or "")}
    return any(r in ids for r in refs)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return run(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    spec = args.format or ("%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R" if args.long else DEFAULT_FORMAT)
    cols, tail = parse_long_format(args.long_format) if args.long_format else parse_format(spec)
    states = wanted_states(args.states) if args.states else ["PENDING", "HELD", "SCHEDULED", "RUNNING"]
    users: list[str | None] = list(_csv(args.user)) or [None]
    pools: list[str | None] = list(_csv(args.partition)) or [None]
    names, refs = set(_csv(args.name)), _csv(args.jobs)
    folded = not args.array and not refs
    now = time.time()
    jobs: dict[int, dict[str, Any]] = {}
    with connect() as c:
        if args.me:
            users = [str(c.request("GET", "/users/me")["name"])]
        for user in users:
            for pool in pools:
                for j in c.job_listing(states=states or None, user=user, pool=pool, collapsed=folded):
                    jobs[int(j["id"])] = j
    found = [jobs[k] for k in sorted(jobs)]
    if names:
        found = [j for j in found if j.get("name") in names]
    if refs:
        found = [j for j in found if _matches(j, refs)]
    if args.states and not states:
        found = []  # states gpufleet's jobs never rest in (SUSPENDED...)
    lines = render(found, cols, tail, header=not args.noheader, now=now)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


__all__ = ["DEFAULT_FORMAT", "FORMATS", "main", "parse_format", "parse_long_format", "render"]
