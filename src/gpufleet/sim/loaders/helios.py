"""SenseTime Helios trace (Hu et al., SC'21): ``cluster_log.csv`` of
S-Lab-System-Group/HeliosData.

Columns are read by header name, in any order; extra columns are ignored. Required:
``job_id,user,gpu_num,submit_time,duration``; ``node_num`` (default 1) and ``vc`` are
optional. The team is ``vc`` when the file has it, else the user. Every state is kept
(COMPLETED, FAILED, TIMEOUT, ...): each ran for ``duration`` seconds and occupied GPUs;
cancelled-before-start rows have duration 0 and are skipped by the duration rule. CPU-only
jobs (``gpu_num`` 0) are skipped as problems, as in every format.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.sim.loaders._rows import (
    load_with_header,
    text,
    to_float,
    to_int,
    to_timestamp,
)
from gpufleet.sim.trace import TraceJob, TraceLoad

REQUIRED = ("job_id", "user", "gpu_num", "submit_time", "duration")


def load_helios(path: Path) -> TraceLoad:
    return load_with_header(
        path, required=REQUIRED, fmt="Helios", expected="a Helios cluster_log header", parse=parse_row
    )


def parse_row(row: dict[str, str]) -> TraceJob:
    user = text(row, "user")
    gpus = to_int(text(row, "gpu_num"), "gpu_num")
    nodes = to_int(row.get("node_num") or "1", "node_num")
    return TraceJob(
        job_id=text(row, "job_id"),
        user=user,
        team=row.get("vc") or user,
        submit_s=to_timestamp(text(row, "submit_time"), "submit_time"),
        duration_s=to_float(text(row, "duration"), "duration"),
        gpus=gpus,
        gpus_per_node=gpus // nodes if nodes > 1 and gpus > 0 and gpus % nodes == 0 else 0,
    )
