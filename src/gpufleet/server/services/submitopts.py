"""A submission's options read and checked before its transaction, with no database:
the time limit and requeue backoff, Slurm's batch options (memory, tasks and CPUs, begin,
deadline, signal, gpufleet's checkpoint interval), the GPUs it counts, and MIG slices
and GPU shares kept on one node. What needs the pool, the fleet or the accounts is checked in the transaction
(``submitfit.py``, ``submitchecks.py``)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from gpufleet import mig, slurmopts
from gpufleet.api.jobs import JobSubmit
from gpufleet.server.problems import Failure, invalid
from gpufleet.timefmt import parse_duration

MAX_TIME_LIMIT_S = 365 * 86400.0
MAX_CHECKPOINT_S = 30 * 86400.0


def time_limit(value: str | float | None) -> float | Failure | None:
    """A time limit as given (seconds, or a duration such as 2h), checked; None: none."""
    if value is None:
        return None
    try:
        secs = float(value) if isinstance(value, int | float) else parse_duration(value)
    except ValueError as exc:
        return invalid(f"time_limit: {exc}")
    if not 0 < secs <= MAX_TIME_LIMIT_S:
        return invalid(f"time_limit must be between 1 second and 365 days, got {value!r}")
    return secs


def requeue_backoff(value: str | float) -> float | Failure:
    try:
        secs = float(value) if isinstance(value, int | float) else parse_duration(value)
    except ValueError as exc:
        return invalid(f"requeue_backoff: {exc}")
    if not 0 <= secs <= 86_400:
        return invalid(f"requeue_backoff must be between 0 and 1 day, got {value!r}")
    return secs


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOptions:
    """Slurm's batch options of a submission, read and checked before the transaction;
    the pool's defaults are applied in it (``submissions._resources``)."""

    tasks_per_node: int = 0
    cpus_per_task: int = 0
    cpus_per_node: int = 0  # 0: not asked (the pool's default applies)
    mem: tuple[str, int] | None = None  # ("node" | "cpu" | "gpu", MiB); ("all", 0): --mem=0
    begin_at: float | None = None
    deadline: float | None = None
    signal: str | None = None
    checkpoint_s: float | None = None
    """gpufleet's own ``--checkpoint-every`` (``checkpoint_every``), seconds."""


def checkpoint_every(value: str | float | None) -> float | Failure | None:
    """``--checkpoint-every`` as given (seconds, or a duration such as 30m), checked;
    None: not declared."""
    if value is None:
        return None
    try:
        secs = float(value) if isinstance(value, int | float) else parse_duration(value)
    except ValueError as exc:
        return invalid(f"checkpoint_every: {exc}")
    if not (math.isfinite(secs) and 1 <= secs <= MAX_CHECKPOINT_S):
        return invalid(f"checkpoint_every must be between 1 second and 30 days, got {value!r}")
    return secs


def batch_options(spec: JobSubmit, *, now: float, time_limit_s: float | None) -> BatchOptions | Failure:
    """Slurm's rules: ``--mem``, ``--mem-per-cpu`` and ``--mem-per-gpu`` exclude each
    other; tasks per node are ``--ntasks-per-node``, else ``--ntasks`` over ``--nodes``
    (all on one node when the scheduler picks the nodes); CPUs per node are tasks per
    node x ``--cpus-per-task``. Times: epoch seconds or ``slurmopts.parse_when`` in UTC."""
    given = [
        (k, v) for k, v in (("node", spec.mem), ("cpu", spec.mem_per_cpu), ("gpu", spec.mem_per_gpu)) if v
    ]
    if len(given) > 1 or (spec.mem is not None and len(given) == 1 and given[0][0] != "node"):
        return invalid("mem, mem_per_cpu and mem_per_gpu exclude each other (as in Slurm): give one")
    mem: tuple[str, int] | None = None
    if spec.mem is not None and str(spec.mem).strip() in ("0", "0M", "0G", "0MB", "0GB"):
        given, mem = [], ("all", 0)  # Slurm's --mem=0: all of each node's memory (``submitfit._whole_nodes``)
    if given:
        kind, raw = given[0]
        flag = {"node": "--mem", "cpu": "--mem-per-cpu", "gpu": "--mem-per-gpu"}[kind]
        try:
            mb = int(raw) if isinstance(raw, int) else slurmopts.parse_mem(raw, flag=flag)
        except ValueError as exc:
            return invalid(str(exc))
        if not 1 <= mb <= slurmopts.MAX_MEM_MB:
            return invalid(f"{flag}: between 1 and {slurmopts.MAX_MEM_MB} MiB")
        mem = (kind, mb)
    if spec.ntasks_per_node is not None:
        tasks = spec.ntasks_per_node
        if spec.ntasks is not None and spec.nodes and spec.ntasks > spec.ntasks_per_node * spec.nodes:
            return invalid(
                f"ntasks ({spec.ntasks}) > ntasks_per_node ({spec.ntasks_per_node}) x nodes ({spec.nodes})"
            )
    elif spec.ntasks is not None:
        tasks = -(-spec.ntasks // spec.nodes) if spec.nodes else spec.ntasks
    else:
        tasks = 0
    cpt = spec.cpus_per_task or 0
    cpus = (cpt or 1) * (tasks or 1) if (cpt or tasks) else 0
    if cpus > 1_000_000:
        return invalid(f"{cpus} CPUs per node: more than any node has")
    times: dict[str, float | None] = {"begin": None, "deadline": None}
    for name, when in (("begin", spec.begin), ("deadline", spec.deadline)):
        if when is None:
            continue
        try:
            at = (
                float(when)
                if isinstance(when, int | float)
                else slurmopts.parse_when(when, now=now, tz=dt.UTC, flag=f"--{name}")
            )
        except ValueError as exc:
            return invalid(f"{name}: {exc}")
        if not math.isfinite(at) or not 0 <= at <= now + 10 * 365 * 86400:
            return invalid(f"{name}: {when!r} is not a time within the next 10 years")
        times[name] = at
    begin, deadline = times["begin"], times["deadline"]
    if deadline is not None:
        start = max(now, begin or now)
        if deadline <= start:
            return invalid(f"deadline: {spec.deadline!r} is not after the job could start")
        if time_limit_s is not None and start + time_limit_s > deadline:
            return invalid(f"deadline: a job with a {time_limit_s:g} s time limit cannot end by it")
    every = checkpoint_every(spec.checkpoint_every)
    if isinstance(every, Failure):
        return every
    sig = None
    if spec.signal is not None:
        try:
            sig = slurmopts.parse_signal(spec.signal)
        except ValueError as exc:
            return invalid(f"signal: {exc}")
    return BatchOptions(
        tasks_per_node=tasks,
        cpus_per_task=cpt,
        cpus_per_node=cpus,
        mem=mem,
        begin_at=begin,
        deadline=deadline,
        signal=sig,
        checkpoint_s=every,
    )


def counted_gpus(spec: JobSubmit) -> JobSubmit:
    """GPUs in all when ``gpus`` is left at 0 (Slurm's default: none) but the job asks
    for GPUs another way: ``gpus_per_node`` (times its nodes), a GPU model, memory or
    share (one GPU)."""
    if spec.gpus:
        return spec
    if spec.gpus_per_node:
        return spec.model_copy(update={"gpus": spec.gpus_per_node * (spec.nodes or 1)})
    if spec.gpu_type is not None or spec.gpu_memory is not None or spec.gpu_fraction is not None:
        return spec.model_copy(update={"gpus": 1})
    return spec


def one_node_of_slices(spec: JobSubmit) -> JobSubmit | Failure:
    """A job asking for MIG slices (``gpu_type`` "MIG 1g.10gb", ``gpufleet.mig``) has them
    on one node, as a Kubernetes pod has its ``nvidia.com/mig-*`` devices: ``nodes`` 1. A
    GPU share's units (``gpu_type`` "SHARED") are on one GPU: at most ``SHARE_UNITS``."""
    if mig.wants_share(spec.gpu_type):
        if spec.gpus > mig.SHARE_UNITS or spec.nodes > 1:
            return invalid(
                f"gpu_type {spec.gpu_type}: a GPU share is part of one GPU "
                f"(gpus: its percent, 1..{mig.SHARE_UNITS}; ask gpu_fraction instead)"
            )
        return spec.model_copy(update={"nodes": 1, "gpus_per_node": spec.gpus})
    if not mig.wants_slices(spec.gpu_type):
        return spec
    if spec.nodes > 1 or (spec.gpus_per_node and spec.gpus_per_node != spec.gpus):
        return invalid(f"gpu_type {spec.gpu_type}: a job's MIG slices are on one node (nodes 1)")
    return spec.model_copy(update={"nodes": 1, "gpus_per_node": spec.gpus})
