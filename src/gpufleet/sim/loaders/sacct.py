"""Slurm accounting exports: ``sacct --parsable2`` (``|``-separated, header first), e.g.
``sacct -a -X --parsable2 --format=JobID,JobName,User,Account,Partition,Submit,Start,End,Elapsed,
Timelimit,AllocTRES,ReqTRES,NNodes,State,Priority``.

Columns are read by name. Required: ``JobID``, ``Submit`` and either ``Elapsed`` or
``Start`` + ``End`` (``Elapsed`` wins when both are there). GPUs come from ``AllocTRES``
(``gres/gpu=4``, ``gres/gpu:a100=4``; the typed form names ``gpu_type``), else
``ReqTRES``, else ``AllocGRES``/``ReqGRES`` (``gpu:4``, ``gpu:a100:4``). Team = Account,
else User. ``JobName`` (optional) is the job's name, what its run time is predicted
from. Times are naive local ISO times; only their differences are used.

Job steps (``123.batch``, ``123.0``) are not jobs and are passed over silently, so an
export made without ``-X`` loads the same. PENDING jobs, jobs that never started
(Start ``Unknown``/``None``) and jobs without GPUs are reported as problems.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.sim.loaders._rows import (
    BadRow,
    TraceBuilder,
    as_mapping,
    column_index,
    open_trace,
    text,
    to_float,
    to_int,
    to_timestamp,
)
from gpufleet.sim.trace import TraceError, TraceJob, TraceLoad

_NEVER_STARTED = ("", "Unknown", "None")
_NO_LIMIT = ("", "UNLIMITED", "Partition_Limit", "INVALID")
_GPU_COLUMNS = ("AllocTRES", "ReqTRES", "AllocGRES", "ReqGRES")


def load_sacct(path: Path) -> TraceLoad:
    builder = TraceBuilder(source=str(path))
    with open_trace(path) as handle:
        lines = ((number, raw.rstrip("\r\n")) for number, raw in enumerate(handle, start=1))
        header = next(((n, raw) for n, raw in lines if raw.strip()), None)
        if header is None:
            raise TraceError(f"{path}: empty file, expected a sacct --parsable2 header")
        index = column_index(header[1].split("|"), required=("JobID", "Submit"), fmt="sacct")
        if "Elapsed" not in index and not {"Start", "End"} <= index.keys():
            raise TraceError(f"{path}: sacct header needs Elapsed or Start and End")
        for line, raw in lines:
            if not raw.strip():
                continue
            try:
                row = as_mapping(raw.split("|"), index)
                if "." in row["JobID"]:
                    continue
                job = parse_row(row)
            except BadRow as exc:
                builder.skip(line, str(exc))
            else:
                builder.add(line, job)
    return builder.finish()


def parse_row(row: dict[str, str]) -> TraceJob:
    job_id = text(row, "JobID")
    state = row.get("State", "")
    if state.startswith("PENDING"):
        raise BadRow(f"job {job_id} is PENDING")
    start = row.get("Start")
    if start is not None and start in _NEVER_STARTED:
        raise BadRow(f"job {job_id} never started ({state or 'no state'})")
    submit = to_timestamp(text(row, "Submit"), "Submit")
    if row.get("Elapsed"):
        duration = slurm_duration(row["Elapsed"], "Elapsed")
    else:
        duration = to_timestamp(text(row, "End"), "End") - to_timestamp(text(row, "Start"), "Start")
    gpus, gpu_type = gpu_request(row)
    nodes = to_int(row.get("NNodes") or "1", "NNodes")
    limit = row.get("Timelimit", "")
    user = row.get("User") or "unknown"
    return TraceJob(
        job_id=job_id,
        user=user,
        team=row.get("Account") or user,
        submit_s=submit,
        duration_s=duration,
        gpus=gpus,
        gpus_per_node=gpus // nodes if nodes > 1 and gpus > 0 and gpus % nodes == 0 else 0,
        time_limit_s=None if limit in _NO_LIMIT else slurm_duration(limit, "Timelimit"),
        priority=to_int(row.get("Priority") or "0", "Priority"),
        gpu_type=gpu_type,
        name=(row.get("JobName") or "").strip(),
    )


def gpu_request(row: dict[str, str]) -> tuple[int, str | None]:
    """(GPUs, model or None) from the first GPU-bearing TRES/GRES column.

    Slurm lists a typed job's GPUs twice (``gres/gpu=4,gres/gpu:a100=4``); the untyped
    total wins and the type is kept when exactly one model is named."""
    for column in _GPU_COLUMNS:
        total: int | None = None
        typed: dict[str, int] = {}
        for item in row.get(column, "").split(","):
            entry = _gpu_entry(item.strip(), tres=column.endswith("TRES"))
            if entry is None:
                continue
            model, count = entry
            if model is None:
                total = count
            else:
                typed[model] = typed.get(model, 0) + count
        if total is not None or typed:
            gpus = total if total is not None else sum(typed.values())
            return gpus, next(iter(typed)) if len(typed) == 1 else None
    return 0, None


def _gpu_entry(item: str, *, tres: bool) -> tuple[str | None, int] | None:
    """(model, count) of one GPU entry (``gres/gpu:a100=4`` or ``gpu:a100:4(IDX:0-3)``)."""
    if tres:
        name, _, count = item.partition("=")
        parts = name.split(":")
        if parts[0] != "gres/gpu" or len(parts) > 2:
            return None
        model = parts[1] if len(parts) == 2 else None
    else:
        parts = item.split("(", 1)[0].split(":")
        if parts[0] != "gpu" or len(parts) > 3:
            return None
        count = parts[-1] if len(parts) > 1 else "1"
        model = parts[1] if len(parts) == 3 else None
    if not count.isdigit():
        raise BadRow(f"bad GPU count in {item!r}")
    return model, int(count)


def slurm_duration(value: str, name: str) -> float:
    """Seconds of a Slurm duration: ``[D-]HH:MM:SS``, ``D-HH[:MM]``, ``MM:SS`` or ``MM``."""
    days_part, dash, clock = value.rpartition("-")
    fields = clock.split(":")
    if dash and not days_part:
        raise BadRow(f"{name} is not a Slurm duration: {value!r}")
    try:
        days = int(days_part) if days_part else 0
        numbers = [to_float(part, name) for part in fields]
    except ValueError:
        raise BadRow(f"{name} is not a Slurm duration: {value!r}") from None
    if len(fields) > 3 or days < 0 or any(number < 0 for number in numbers):
        raise BadRow(f"{name} is not a Slurm duration: {value!r}")
    if days_part:
        hours, minutes, seconds = (*numbers, 0.0, 0.0)[:3]
    else:
        hours, minutes, seconds = (0.0, 0.0, *numbers)[-3:] if len(numbers) > 1 else (0.0, numbers[0], 0.0)
    return days * 86400 + hours * 3600 + minutes * 60 + seconds
