"""Alibaba ``cluster-trace-gpu-v2023`` pod lists (the "openb" traces of the FGD paper,
Weng et al., ATC'23): ``openb_pod_list_*.csv``, one row per Kubernetes pod.

Header: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
creation_time,deletion_time,scheduled_time``; times are integer seconds from the trace's
start. Columns are found by name, so a reordered copy reads the same; ``cpu_milli`` and
``memory_mib`` are not needed (the simulator places GPUs only) and are not checked.

One pod is one job, named by ``name``:

- GPUs: ``num_gpu`` per pod; 0 is a CPU-only pod, skipped as "no GPUs requested" like a
  0-GPU job of every other format. ``gpu_milli`` is the share of each GPU in thousandths:
  1000 for whole GPUs, 1..999 only with ``num_gpu`` 1 (else the row is a problem). It is
  kept on ``TraceJob.gpu_milli``; on a fleet with shared GPUs the simulator asks for a
  share of one (``sim/shares.py``; ``gpufleet simulate --shared-gpus``), else a whole GPU.
- Times: submit = ``creation_time``; duration = ``deletion_time - scheduled_time`` when
  the pod was scheduled, else ``deletion_time - creation_time`` (the published lists give
  every pod that ran a ``scheduled_time``; without one the pod's whole life is the best
  estimate of its run). An empty ``scheduled_time`` means never scheduled; a Pending pod
  without one never ran and is a problem. A pod with no ``deletion_time`` was still
  running when the trace ended: its length is unknown, so it is a problem ("no
  deletion_time") rather than a job cut at the last time in the file, which would add
  short jobs the cluster never saw. A ``scheduled_time`` before ``creation_time`` is a
  problem; a non-positive duration is one as in every format.
- Model: ``gpu_spec`` is empty (any model) or a ``|``-separated list of the models the pod
  accepts (``V100M16|V100M32``, ``P100``, ``T4``, ``A10``, ``G2``, ``G3``). ``gpu_type``
  holds one model, so exactly one named model becomes ``gpu_type``; none or several mean
  any model (None): a list cannot be narrowed to one without refusing hosts it accepts.
- Priority from ``qos`` (case-insensitive): LS (latency-sensitive) 3 > Guaranteed 2 >
  Burstable 1 > BE (best effort) 0, after Kubernetes' QoS classes and the paper's LS/BE
  split. Another or an empty value is a problem rather than a silent guess.
- User and team: the trace names none, and pod names (``openb-pod-0017``) carry no owner,
  so both are ``openb``; per-user fair share has nothing to split on this trace.
- ``pod_phase`` (Running, Succeeded, Failed, Pending...) only matters for Pending pods:
  a Failed pod held its GPUs until deleted and is replayed like the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpufleet.sim.loaders._rows import (
    BadRow,
    load_with_header,
    text,
    to_int,
)
from gpufleet.sim.trace import TraceJob, TraceLoad, gpu_share_problem

COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
REQUIRED = tuple(name for name in COLUMNS if name not in ("cpu_milli", "memory_mib"))
QOS_PRIORITY = {"ls": 3, "guaranteed": 2, "burstable": 1, "be": 0}
"""``qos`` (lower-cased) -> ``TraceJob.priority``; higher is more important."""
OWNER = "openb"


def load_openb(path: Path) -> TraceLoad:
    return load_with_header(
        path, required=REQUIRED, fmt="openb pod list", expected=f"header {','.join(COLUMNS)}", parse=parse_pod
    )


def parse_pod(row: Mapping[str, str]) -> TraceJob:
    """One pod as a job; ``BadRow`` says why it cannot be one."""
    name = text(row, "name")
    gpus = to_int(text(row, "num_gpu"), "num_gpu")
    if gpus < 0:
        raise BadRow(f"negative GPU count: {gpus}")
    if gpus == 0:  # checked first: a CPU-only pod's other fields (gpu_milli 0...) are moot
        raise BadRow("no GPUs requested (a CPU-only pod)")
    gpu_milli = to_int(text(row, "gpu_milli"), "gpu_milli")
    if (problem := gpu_share_problem(gpus, gpu_milli)) is not None:
        raise BadRow(problem)
    created = to_int(text(row, "creation_time"), "creation_time")
    scheduled = to_int(row["scheduled_time"], "scheduled_time") if row["scheduled_time"] else None
    if scheduled is None and row["pod_phase"].lower() == "pending":
        raise BadRow("Pending pod was never scheduled (no scheduled_time)")
    if not row["deletion_time"]:
        raise BadRow("no deletion_time: the pod was still running when the trace ended")
    deleted = to_int(row["deletion_time"], "deletion_time")
    if scheduled is not None and scheduled < created:
        raise BadRow(f"scheduled_time {scheduled} is before creation_time {created}")
    qos = text(row, "qos")
    priority = QOS_PRIORITY.get(qos.lower())
    if priority is None:
        raise BadRow(f"unknown qos {qos!r}; known: LS, Guaranteed, Burstable, BE")
    models = [model.strip() for model in row["gpu_spec"].split("|") if model.strip()]
    return TraceJob(
        job_id=name,
        user=OWNER,
        team=OWNER,
        submit_s=float(created),
        duration_s=float(deleted - (created if scheduled is None else scheduled)),
        gpus=gpus,
        priority=priority,
        gpu_type=models[0] if len(models) == 1 else None,
        gpu_milli=gpu_milli,
    )
