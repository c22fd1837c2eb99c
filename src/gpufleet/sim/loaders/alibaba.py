"""Alibaba PAI 2020 GPU trace (Weng et al., NSDI'22): ``pai_task_table.csv``.

The published files have no header; a first row starting with ``job_name`` is skipped.
Columns: ``job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,
plan_gpu,gpu_type``, times in Unix seconds. ``plan_gpu`` is percent of one GPU per
instance; a fractional share occupies a whole GPU (the simulator does not share GPUs), so
a task takes ``inst_num * ceil(plan_gpu / 100)`` GPUs; an empty ``plan_gpu`` is a CPU
task (0 GPUs).

A job is the sum of its tasks: GPUs add up, submit = earliest task start, duration =
latest task end - earliest task start. The trace has no submit time, so queueing before
the first task started is lost. Every status (Terminated, Failed, Running, Waiting) is
kept as long as all of the job's tasks have valid times; a task row that cannot be parsed
drops its whole job (the problem is reported on that row). ``gpu_type`` is kept when the
GPU tasks that name a model all name the same one; MISC/empty everywhere, or two different
models, mean any model (None).

Users: when ``pai_job_table.csv`` (``job_name,inst_id,user,status,start_time,end_time``,
no header) sits next to the task table, the user comes from it; otherwise, and for jobs
it lacks, the user is ``unknown``. The team is the user: the trace names no groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.sim.loaders._rows import (
    BadRow,
    TraceBuilder,
    numbered_rows,
    open_trace,
    text,
    to_float,
    to_int,
)
from gpufleet.sim.trace import TraceJob, TraceLoad

TASK_COLUMNS = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)
JOB_TABLE = "pai_job_table.csv"
UNKNOWN_USER = "unknown"
_ANY_GPU = ("", "MISC")


@dataclass(slots=True)
class _JobTasks:
    """The tasks of one job seen so far (mutable accumulator, local to one load)."""

    line: int
    gpus: int = 0
    start: float = math.inf
    end: float = -math.inf
    gpu_types: set[str] = field(default_factory=set)


def load_alibaba(path: Path) -> TraceLoad:
    builder = TraceBuilder(source=str(path))
    jobs: dict[str, _JobTasks] = {}
    dropped: set[str] = set()
    with open_trace(path) as handle:
        for line, record in numbered_rows(handle):
            if record[0].strip() == "job_name":  # a header row, where a copy has one
                continue
            name = record[0].strip()
            try:
                _add_task(jobs.setdefault(name, _JobTasks(line=line)) if name else None, record)
            except BadRow as exc:
                suffix = f"; job {name} skipped" if name and name not in dropped else ""
                builder.skip(line, f"{exc}{suffix}")
                dropped.add(name)
    users = _job_users(path.with_name(JOB_TABLE), builder)
    for name, tasks in jobs.items():
        if name in dropped:
            continue
        user = users.get(name, UNKNOWN_USER)
        builder.add(
            tasks.line,
            TraceJob(
                job_id=name,
                user=user,
                team=user,
                submit_s=tasks.start,
                duration_s=tasks.end - tasks.start,
                gpus=tasks.gpus,
                gpu_type=next(iter(tasks.gpu_types)) if len(tasks.gpu_types) == 1 else None,
            ),
        )
    return builder.finish()


def _add_task(tasks: _JobTasks | None, record: list[str]) -> None:
    if len(record) < len(TASK_COLUMNS):
        raise BadRow(f"expected {len(TASK_COLUMNS)} fields, got {len(record)}")
    row = dict(zip(TASK_COLUMNS, (cell.strip() for cell in record), strict=False))
    if tasks is None:
        raise BadRow("missing job_name")
    instances = to_int(text(row, "inst_num"), "inst_num")
    share = to_float(row["plan_gpu"], "plan_gpu") if row["plan_gpu"] else 0.0
    if instances < 0 or share < 0:
        raise BadRow(f"negative inst_num or plan_gpu: {instances}, {share:g}")
    start = to_float(text(row, "start_time"), "start_time")
    end = to_float(text(row, "end_time"), "end_time")
    gpus = instances * math.ceil(share / 100)
    tasks.gpus += gpus
    tasks.start = min(tasks.start, start)
    tasks.end = max(tasks.end, end)
    if gpus and row["gpu_type"] not in _ANY_GPU:
        tasks.gpu_types.add(row["gpu_type"])


def _job_users(job_table: Path, builder: TraceBuilder) -> dict[str, str]:
    """job_name -> user from the job table next to the task table, if there is one."""
    if not job_table.is_file():
        return {}
    users: dict[str, str] = {}
    with open_trace(job_table) as handle:
        for line, record in numbered_rows(handle):
            if record[0].strip() == "job_name":  # a header row, where a copy has one
                continue
            if len(record) < 3 or not record[0].strip() or not record[2].strip():
                builder.skip(line, f"{JOB_TABLE}: expected job_name and user")
                continue
            users[record[0].strip()] = record[2].strip()
    return users
