"""``gpufleet jobs show``: one job as lines of text (a pure function of the API's reply,
read as the server's JSON: ``JobDetail``'s fields, not the model, whose import costs
~100 ms of a command that should answer at once; a ``JobDetail`` is taken too).

Where the job is: its allocation while it holds GPUs. Once it let them go the rows are
gone, so its last ``placed`` event says where it ran (``placefmt``). A batch script (the
command ``submit job.sh`` packs, ``sbatch.BatchScript``) is shown as a script: its name,
then its first lines and how many more there are. Nothing is cut inside a word.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpufleet.cli import words
from gpufleet.migindex import SLICE_BASE, device_labels, gpus_label
from gpufleet.placefmt import gpu_ranges, parse_placed
from gpufleet.slurm.batchscript import BatchScript
from gpufleet.timefmt import format_duration

if TYPE_CHECKING:
    from gpufleet.api.jobs import JobDetail

Job = Mapping[str, Any]
"""A job as the server's JSON (``GET /v1/jobs/{id}``)."""

SCRIPT_LINES = 10
"""Lines of a batch script shown; the rest are counted (``--json`` has them all)."""
COMMAND_CHARS = 200
"""A longer command is shown up to the last whole word within this many characters."""
_LABEL = 16
_UNDER = " " * (_LABEL + 2)  # a script's lines start under the value column


def clip(text: str, most: int) -> str:
    """``text``, or its words that fit in ``most`` characters and how much was left
    out. A first word longer than ``most`` is kept whole: a word is never cut."""
    if len(text) <= most:
        return text
    cut = text.rfind(" ", 0, most + 1)
    if cut <= 0:
        cut = text.find(" ", most)
        if cut < 0:
            return text
    rest = len(text) - cut
    return f"{text[:cut]} ... ({rest} more characters)"


def _where(node: str, gpus: Sequence[int]) -> str:
    if gpus and max(gpus) >= SLICE_BASE:  # MIG slices: migGPU.START each; a share GPU@N%
        return f"{node}:{','.join(device_labels(list(gpus)))}"
    return f"{node}:{gpu_ranges(gpus)}" if gpus else node


def placement(job: Job) -> tuple[str, str | None]:
    """(label, where): the allocation it holds; else where its last placement put it
    (``ran on``, or ``placed on`` if it never started there); else nothing."""
    allocation = job.get("allocation") or []
    if allocation:
        return "allocation", " ".join(_where(a["node"], a["gpus"]) for a in allocation)
    events = list(job.get("events") or [])
    for i in range(len(events) - 1, -1, -1):
        placed = parse_placed(events[i]["reason"]) if events[i]["to_state"] == "SCHEDULED" else None
        if placed is None:
            continue
        where = " ".join(_where(n, g) for n, g in placed.nodes)
        if not placed.complete:
            where += " ... (the event names no more nodes)"
        ran = any(e["to_state"] == "RUNNING" for e in events[i + 1 :])
        return ("ran on" if ran else "placed on"), where
    return "allocation", None


def command_lines(command: Sequence[str]) -> tuple[str, list[str]]:
    """(the command line to show, the script's lines to show under it)."""
    script = BatchScript.of(command)
    if script is None:
        return clip(shlex.join(command), COMMAND_CHARS), []
    lines = script.text.splitlines()
    run = shlex.join(["bash", script.name, *script.args])
    head = f"{run}  (batch script, {words.count(len(lines), 'line')})"
    shown = [f"{_UNDER}{clip(line, COMMAND_CHARS)}".rstrip() for line in lines[:SCRIPT_LINES]]
    if len(lines) > SCRIPT_LINES:
        more = len(lines) - SCRIPT_LINES
        shown.append(f"{_UNDER}... {words.count(more, 'more line')} (--json shows the whole script)")
    return clip(head, COMMAND_CHARS), shown


def _eta(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    delta = at - now
    return "now" if delta <= 1 else "in " + format_duration(delta)


def _event(e: Job) -> str:
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
    return f"  {at}  {e.get('from_state') or '-':>9} -> {e['to_state']:<9} {e['actor']}: {e['reason']}"


def _when(at: float | None) -> str | None:
    return None if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def batch_fields(job: Job) -> list[tuple[str, object]]:
    """Slurm's batch options the job has (``jobs show`` lists only those set)."""
    array = job.get("array_job_id")
    mem = job.get("mem_per_node_mb")
    return [
        ("array", None if array is None else f"{array}_{job.get('array_task_id')}"),
        ("dependency", job.get("dependency")),
        ("cpus per node", job.get("cpus_per_node")),
        ("memory per node", f"{mem} MiB" if mem else None),
        ("begin", _when(job.get("begin_at"))),
        ("deadline", _when(job.get("deadline"))),
        ("max price", job.get("max_price")),
        ("signal", job.get("signal")),
        ("output", job.get("output")),
        ("error", job.get("error")),
        ("input", job.get("input")),
        ("workdir", job.get("workdir") or job.get("submit_dir")),
    ]


def show_lines(given: Job | JobDetail, *, now: float) -> list[str]:
    job: Job = given if isinstance(given, Mapping) else given.model_dump()
    command, script = command_lines(job["command"])
    label, where = placement(job)
    limit = job.get("time_limit_s")
    fields: list[tuple[str, object]] = [
        ("id", job["id"]),
        ("name", job["name"]),
        ("user", job["user"]),
        ("team", job["team"]),
        ("pool", job["pool"]),
        ("state", job["state"]),
        ("gpus", gpus_label(job["gpus"], job.get("gpu_type"))),
        ("gpu type", job.get("gpu_type")),
        ("priority", job.get("priority")),
        ("time limit", None if limit is None else format_duration(limit)),
        ("command", command),
    ]
    lines = [f"{k:>{_LABEL}}: {'-' if v is None else v}" for k, v in fields]
    lines += script
    lines += [f"{k:>{_LABEL}}: {v}" for k, v in batch_fields(job) if v not in (None, "", 0)]
    tail: list[tuple[str, object]] = [
        (label, where),
        ("position", job.get("queue_position")),
        ("estimated start", _eta(job.get("estimated_start"), now)),
        ("reason", job.get("wait_reason")),
        ("exit code", job.get("exit_code")),
        ("cost", f"{job['cost']:.2f}" if job.get("cost") else None),
        ("energy", f"{job['energy_kwh']:.3f} kWh" if job.get("energy_kwh") else None),
    ]
    lines += [f"{k:>{_LABEL}}: {'-' if v is None else v}" for k, v in tail]
    lines += prediction_lines(job, now=now)
    lines += diagnosis_lines(job.get("diagnosis"))
    lines.append("events:")
    lines += [_event(e) for e in job.get("events") or ()]
    return lines


def prediction_lines(job: Job, *, now: float) -> list[str]:
    """The scheduler's predicted run time (issue 33) and what it is based on: a running
    job's predicted end, another's predicted run; nothing without a prediction."""
    seconds = job.get("predicted_s")
    if seconds is None:
        return []
    why = f"from {job.get('prediction_basis') or '?'}, confidence {job.get('prediction_confidence') or 0:.2f}"
    end = job.get("predicted_end")
    if end is None:
        return [f"{'predicted run':>{_LABEL}}: {format_duration(seconds)} ({why})"]
    late = now - end
    when = f"overdue by {format_duration(late)}" if late > 1 else _eta(end, now)
    return [f"{'predicted end':>{_LABEL}}: {when}, at {_when(end)} ({why})"]


def diagnosis_lines(found: Mapping[str, Any] | None) -> list[str]:
    """What a failed job's output matched (issue 34), as ``jobs show`` prints it."""
    if not found:
        return []
    blame = {"node": "the node", "job": "the job's code"}.get(str(found.get("blame")), "unknown")
    fields = [
        ("diagnosis", f"{found.get('diagnosis')} [{found.get('signature')}]"),
        ("blame", f"{blame} (seen on {found.get('node')})"),
        ("hint", found.get("hint")),
        ("matched", found.get("line")),
    ]
    return [f"{k:>{_LABEL}}: {v}" for k, v in fields if v]


__all__ = [
    "batch_fields",
    "clip",
    "command_lines",
    "diagnosis_lines",
    "placement",
    "prediction_lines",
    "show_lines",
]
