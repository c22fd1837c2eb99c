"""gpufleet's own trace CSV: one row per job, exactly the fields of ``TraceJob``.

Empty ``time_limit_s`` / ``gpu_type`` mean None; ``gpus_per_node`` 0 lets the scheduler
decide. Floats are written with ``repr`` so a write/load round trip is exact. An
optional last column ``dependency`` holds Slurm's ``--dependency`` over the trace's job
ids (``afterok:12``; empty: none); a trace without one keeps the ten columns.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
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
from gpufleet.sim.trace import TraceError, TraceJob, TraceLoad

HEADER = (
    "job_id",
    "user",
    "team",
    "submit_s",
    "duration_s",
    "gpus",
    "gpus_per_node",
    "time_limit_s",
    "priority",
    "gpu_type",
)


def load_gpufleet_csv(path: Path) -> TraceLoad:
    builder = TraceBuilder(source=str(path))
    with open_trace(path) as handle:
        rows = numbered_rows(handle)
        first = next(rows, None)
        if first is None:
            raise TraceError(f"{path}: empty file, expected header {','.join(HEADER)}")
        header = tuple(cell.strip() for cell in first[1])
        if header not in (HEADER, (*HEADER, "dependency")):
            raise TraceError(
                f"{path}: header must be exactly {','.join(HEADER)}[,dependency]; got {','.join(first[1])}"
            )
        for line, record in rows:
            try:
                builder.add(line, parse_row(record, header))
            except BadRow as exc:
                builder.skip(line, str(exc))
    return builder.finish()


def parse_row(record: list[str], header: tuple[str, ...] = HEADER) -> TraceJob:
    if len(record) != len(header):
        raise BadRow(f"expected {len(header)} fields, got {len(record)}")
    row = dict(zip(header, (cell.strip() for cell in record), strict=True))
    limit = row["time_limit_s"]
    return TraceJob(
        job_id=text(row, "job_id"),
        user=text(row, "user"),
        team=text(row, "team"),
        submit_s=to_float(text(row, "submit_s"), "submit_s"),
        duration_s=to_float(text(row, "duration_s"), "duration_s"),
        gpus=to_int(text(row, "gpus"), "gpus"),
        gpus_per_node=to_int(row["gpus_per_node"] or "0", "gpus_per_node"),
        time_limit_s=to_float(limit, "time_limit_s") if limit else None,
        priority=to_int(row["priority"] or "0", "priority"),
        gpu_type=row["gpu_type"] or None,
        dependency=row.get("dependency") or None,
    )


def write_gpufleet_csv(path: Path, jobs: Iterable[TraceJob]) -> None:
    jobs = list(jobs)
    deps = any(j.dependency for j in jobs)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow((*HEADER, "dependency") if deps else HEADER)
        for job in jobs:
            writer.writerow(
                (
                    job.job_id,
                    job.user,
                    job.team,
                    repr(job.submit_s),
                    repr(job.duration_s),
                    job.gpus,
                    job.gpus_per_node,
                    "" if job.time_limit_s is None else repr(job.time_limit_s),
                    job.priority,
                    job.gpu_type or "",
                )
                + ((job.dependency or "",) if deps else ())
            )
