"""gpufleet's own trace CSV: one row per job, exactly the fields of ``TraceJob``.

Empty ``time_limit_s`` / ``gpu_type`` mean None; ``gpus_per_node`` 0 lets the scheduler
decide. Floats are written with ``repr`` so a write/load round trip is exact.

Three optional columns may follow the ten, in this order when written (read in any):
``dependency`` holds Slurm's ``--dependency`` over the trace's job ids (``afterok:12``;
empty: none); ``gpu_milli`` the share of each GPU in thousandths (an integer 1..1000,
empty: 1000; below 1000 only with ``gpus`` 1); ``checkpoint_s`` how often the job saves
its state, seconds of work (> 0; empty: not declared, the simulator's
``--checkpoint-every`` applies); ``name`` the job's name (what its run time is predicted
from, with its user; empty: unknown). The writer adds a column only when some job needs it,
so a trace without them keeps the ten columns and older files round-trip byte for byte.
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
from gpufleet.sim.trace import WHOLE_GPU, TraceError, TraceJob, TraceLoad, gpu_share_problem

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
OPTIONAL = ("dependency", "gpu_milli", "checkpoint_s", "name")


def load_gpufleet_csv(path: Path) -> TraceLoad:
    builder = TraceBuilder(source=str(path))
    with open_trace(path) as handle:
        rows = numbered_rows(handle)
        first = next(rows, None)
        if first is None:
            raise TraceError(f"{path}: empty file, expected header {','.join(HEADER)}")
        header = tuple(cell.strip() for cell in first[1])
        if not _known_header(header):
            raise TraceError(
                f"{path}: header must be exactly {','.join(HEADER)}"
                "[,dependency][,gpu_milli][,checkpoint_s][,name]; "
                f"got {','.join(first[1])}"
            )
        for line, record in rows:
            try:
                builder.add(line, parse_row(record, header))
            except BadRow as exc:
                builder.skip(line, str(exc))
    return builder.finish()


def _known_header(header: tuple[str, ...]) -> bool:
    """The ten columns, then each optional column at most once."""
    extra = header[len(HEADER) :]
    return header[: len(HEADER)] == HEADER and set(extra) <= set(OPTIONAL) and len(set(extra)) == len(extra)


def parse_row(record: list[str], header: tuple[str, ...] = HEADER) -> TraceJob:
    if len(record) != len(header):
        raise BadRow(f"expected {len(header)} fields, got {len(record)}")
    row = dict(zip(header, (cell.strip() for cell in record), strict=True))
    limit = row["time_limit_s"]
    gpus = to_int(text(row, "gpus"), "gpus")
    milli = row.get("gpu_milli", "")
    gpu_milli = to_int(milli, "gpu_milli") if milli else WHOLE_GPU
    if gpus > 0 and (problem := gpu_share_problem(gpus, gpu_milli)) is not None:
        raise BadRow(problem)  # 0 or negative GPUs: the builder names that problem instead
    every = row.get("checkpoint_s", "")
    checkpoint_s = to_float(every, "checkpoint_s") if every else None
    if checkpoint_s is not None and not checkpoint_s > 0:
        raise BadRow(f"checkpoint_s must be > 0 seconds, got {every}")
    return TraceJob(
        job_id=text(row, "job_id"),
        user=text(row, "user"),
        team=text(row, "team"),
        submit_s=to_float(text(row, "submit_s"), "submit_s"),
        duration_s=to_float(text(row, "duration_s"), "duration_s"),
        gpus=gpus,
        gpus_per_node=to_int(row["gpus_per_node"] or "0", "gpus_per_node"),
        time_limit_s=to_float(limit, "time_limit_s") if limit else None,
        priority=to_int(row["priority"] or "0", "priority"),
        gpu_type=row["gpu_type"] or None,
        dependency=row.get("dependency") or None,
        gpu_milli=gpu_milli,
        checkpoint_s=checkpoint_s,
        name=row.get("name", ""),
    )


def write_gpufleet_csv(path: Path, jobs: Iterable[TraceJob]) -> None:
    jobs = list(jobs)
    deps = any(j.dependency for j in jobs)
    shares = any(j.gpu_milli != WHOLE_GPU for j in jobs)
    every = any(j.checkpoint_s is not None for j in jobs)
    named = any(j.name for j in jobs)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(
            HEADER
            + (("dependency",) if deps else ())
            + (("gpu_milli",) if shares else ())
            + (("checkpoint_s",) if every else ())
            + (("name",) if named else ())
        )
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
                + ((job.gpu_milli,) if shares else ())
                + (("" if job.checkpoint_s is None else repr(job.checkpoint_s),) if every else ())
                + ((job.name,) if named else ())
            )
