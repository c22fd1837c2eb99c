"""Where a job could ever run: its options per group (pool, GPU model) and shape.

They depend only on the fleet's static facts (``FleetIndex``) and the job's shape, so
``shared_options`` keeps them on the index from pass to pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.gpumatch import gpu_type_matches as gpu_type_matches  # the rule lives outside the core
from gpufleet.migindex import (
    SHARE_UNITS,
    device_kind,
    is_share_model,
    is_slice_model,
    wanted_kind,
)
from gpufleet.scheduler.capacity import FleetIndex, GroupInfo, GroupKey
from gpufleet.scheduler.model import JobRequest
from gpufleet.scheduler.placement import Shape, describe_shape, job_shape

Options = list[tuple[GroupKey, Shape]]


def no_such_model(gpu_type: str, pool: str, *, models: Iterable[tuple[str, str]]) -> str:
    """Why no GPU of ``pool`` is a ``gpu_type``, naming the models it has (what the
    caller may ask for instead) and the other pools that have one. ``models``: the
    (pool, GPU model) pairs known, e.g. a fleet index's group keys."""
    pairs = set(models)
    here = sorted({m for p, m in pairs if p == pool})
    there = sorted({p for p, m in pairs if p != pool and gpu_type_matches(gpu_type, m)})
    why = f"no schedulable {gpu_type} GPUs in pool {pool}"
    if here:
        why += f" (its GPU models: {_some(here)})"
    if there:
        why += f"; pools with {gpu_type} GPUs: {_some(there)}"
    return why


def _some(names: list[str], most: int = 8) -> str:
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


def same_kind(groups: list[GroupInfo], gpu_type: str | None) -> list[GroupInfo]:
    """Whole GPUs for a job asking whole GPUs, MIG slices for one asking slices, a shared
    GPU's units for one asking a share (``gpufleet.migindex``): a MIG GPU's slices are never
    a whole GPU, nor a shared GPU, nor the reverse."""
    kind = wanted_kind(gpu_type)
    return [g for g in groups if device_kind(g.key[1]) == kind]


def job_options(index: FleetIndex, job: JobRequest) -> Options | str:
    """The groups (pool, GPU model) where ``job`` could ever run, each with the job's
    per-node shape there; or, if there is none, why (an UnschedulableAndUnresolvable
    reason: unknown pool, no such GPU model, more GPUs than the pool has)."""
    groups = [g for k, g in sorted(index.groups.items()) if k[0] == job.pool]
    if not groups:
        if job.pool in {n.pool for n in index.fleet.nodes}:
            return f"no schedulable node with healthy GPUs in pool {job.pool}"
        return f"unknown pool {job.pool}"
    groups = same_kind(groups, job.gpu_type)
    if job.gpu_type:
        groups = [g for g in groups if gpu_type_matches(job.gpu_type, g.key[1])]
        if not groups:
            return no_such_model(job.gpu_type, job.pool, models=index.groups)
    elif not groups:
        return f"no schedulable node with healthy GPUs in pool {job.pool}"
    out: Options = []
    why = ""
    for g in groups:
        shape = job_shape(job, g.size)
        if is_share_model(g.key[1]) and job.gpus > SHARE_UNITS:
            why = f"needs {job.gpus} % of one GPU, more than a {g.key[1]} GPU has ({SHARE_UNITS} %)"
        elif isinstance(shape, str):
            why = f"{shape} ({g.key[1]} slices)" if is_slice_model(g.key[1]) else shape
        elif all(g.capacity_ge[c] >= i + 1 for i, c in enumerate(shape)):
            out.append((g.key, shape))
        else:
            why = f"needs {describe_shape(shape)}, pool {job.pool} has {g.capacity} {g.key[1]} GPUs"
    return out if out else why


def shared_options(index: FleetIndex, job: JobRequest) -> Options | str:
    """``job_options``, memoised on the index (they depend on its static facts only) per
    job shape. The lists are shared, so callers must not change them."""
    ck = (job.gpus, job.gpus_per_node, job.nodes, job.gpu_type, job.pool)
    memo = index.options_memo
    hit = memo.get(ck)
    if hit is None:
        if len(memo) > 10_000:
            memo.clear()
        hit = memo[ck] = job_options(index, job)
    return hit
