"""A submission checked and shaped against its pool's fleet: the pool it goes to (of a
list, the first that could ever run it), ``--exclusive`` and ``--mem=0`` resolved on
that pool's nodes, the features its ``--constraint`` asks for, whether its shape could
ever run there, and ``gpu_memory`` / ``gpu_fraction`` fitted to a device (a MIG slice, a
share of a shared GPU, or a whole GPU). A refusal on a recent fleet is confirmed on
today's before it is returned."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet import constraint, mig, slurmopts
from gpufleet.api.jobs import JobSubmit
from gpufleet.scheduler import Fleet, JobRequest
from gpufleet.scheduler.capacity import FleetIndex
from gpufleet.scheduler.core import gpu_type_matches, job_options
from gpufleet.scheduler.options import no_such_model
from gpufleet.server.problems import Failure, invalid
from gpufleet.server.services import layoutwait
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.services.submitbatch import Lookups, NewJob
from gpufleet.server.services.submitopts import one_node_of_slices
from gpufleet.server.store.models import GpuRow, NodeRow


def choose_pool(ctx: Lookups, new: NewJob) -> NewJob | Failure:
    """The job with its one pool: the default pool when it names none; of a list
    (Slurm's ``-p a,b``), the first that could ever run it (Slurm starts it in whichever
    frees first: placement across pools is a scheduler change left for later), else the
    first's reason. An unknown name is refused in Slurm's words. ``--exclusive`` and
    ``--mem=0`` are then resolved on that pool's nodes (:func:`_whole_nodes`)."""
    spec = new.spec
    names = spec.pool.split(",") if spec.pool else [ctx.default_pool]
    for name in names:
        if name not in ctx.pools:
            known = ", ".join(sorted(ctx.pools))
            return invalid(f"pool: invalid partition specified: {name} (pools: {known})")
    if len(names) == 1:  # no choice: the checks that follow say what is wrong, if anything
        return _whole_nodes(ctx, dataclasses.replace(new, spec=spec.model_copy(update={"pool": names[0]})))
    first: Failure | None = None
    for name in names:
        shaped = _whole_nodes(ctx, dataclasses.replace(new, spec=spec.model_copy(update={"pool": name})))
        if not isinstance(shaped, Failure) and (spec.gpu_memory is not None or spec.gpu_fraction is not None):
            problem = feature_problem(ctx, shaped)  # its device is fitted later, in the pool chosen
            if problem is None:
                return shaped
            first = first or problem
            continue
        problem = (
            shaped
            if isinstance(shaped, Failure)
            else feature_problem(ctx, shaped) or shape_problem(ctx, shaped.spec, new.fleets)
        )
        if problem is None and not isinstance(shaped, Failure):
            return shaped
        first = first or problem
    assert first is not None
    return first


def feature_problem(ctx: Lookups, new: NewJob) -> Failure | None:
    """Slurm's "Invalid feature specification": no node of the pool has the features
    the job's ``--constraint`` asks for (an empty pool: it waits for nodes)."""
    spec = new.spec
    if spec.constraint is None:
        return None
    terms = constraint.parse(spec.constraint).terms
    fleet = ctx.fleet(new, spec.pool)
    for fresh in (False, True):
        if fresh:  # a refusal is confirmed on today's fleet (a label may have just been added)
            if new.fleets.is_fresh(spec.pool, fleet):
                break
            fleet = ctx.fleets[spec.pool] = new.fleets.registered(ctx.s, spec.pool)
        nodes = [n for n in fleet.nodes if ":" not in n.name]  # real nodes only
        if not nodes:
            return None
        for n in nodes:
            if constraint.holds(terms, constraint.node_has(n.features, n.model, gpu_type_matches)):
                return None
    have = sorted({f for n in nodes for f in n.features} | {n.model for n in nodes if n.model})
    return invalid(
        f"constraint: invalid feature specification: no node of pool {spec.pool} has {spec.constraint} "
        f"(its features and GPU models: {', '.join(have[:20]) or 'none'})"
    )


def _whole_nodes(ctx: Lookups, new: NewJob) -> NewJob | Failure:
    """``--exclusive``: every GPU, CPU and memory of each node it gets (Slurm's whole
    node); ``--mem=0``: all of each node's memory. Nodes differ, so the job asks for what
    its pool's smallest node (of its GPU model) has: it fits on every one, and holds all
    of the smallest (on a larger node, CPUs or memory beyond that stay free for 0-GPU
    jobs, which is the one way this is less than Slurm's). GPUs: with no count, all of
    each node's when the pool's nodes are all one size; with one, at least each node's."""
    spec, opts = new.spec, new.options
    all_mem = opts.mem is not None and opts.mem[0] == "all"
    if not (spec.exclusive or all_mem):
        return new
    pool = spec.pool
    nodes = [
        n
        for n in ctx.fleet(new, pool).nodes
        if not (n.gpus and (mig.is_share_model(n.model) or mig.is_slice_model(n.model)))
        and (spec.gpu_type is None or not n.gpus or gpu_type_matches(spec.gpu_type, n.model))
    ]
    mems = [n.mem_mb for n in nodes if n.mem_mb]
    update: dict[str, Any] = {}
    options = dataclasses.replace(opts, mem=("node", min(mems)) if mems else None) if all_mem else opts
    if spec.exclusive:
        if not nodes:
            model = f" of {spec.gpu_type}" if spec.gpu_type else ""
            return invalid(f"exclusive: pool {pool} has no nodes{model} to take whole")
        cpus = [n.cpus for n in nodes if n.cpus]
        options = dataclasses.replace(
            options,
            cpus_per_node=max(options.cpus_per_node, min(cpus)) if cpus else options.cpus_per_node,
            mem=("node", min(mems)) if mems else options.mem,
        )
        sizes = sorted({len(n.gpus) for n in nodes})
        if sizes != [0] and ctx.pools[pool].gpu:
            shape = whole_gpus(spec, sizes, pool)
            if isinstance(shape, Failure):
                return shape
            update = shape
    spec = spec.model_copy(update=update) if update else spec
    return dataclasses.replace(new, spec=spec, options=options)


def whole_gpus(spec: JobSubmit, sizes: list[int], pool: str) -> dict[str, Any] | Failure:
    """The GPU shape of an exclusive job in a GPU pool whose nodes have ``sizes`` GPUs."""
    nodes = spec.nodes or 0
    if spec.gpus_per_node:
        if spec.gpus_per_node >= sizes[-1]:
            return {}
    elif spec.gpus and len(sizes) == 1 and spec.gpus % sizes[0] == 0:
        return {"gpus_per_node": sizes[0], "nodes": spec.gpus // sizes[0]}
    elif not spec.gpus and len(sizes) == 1:
        return {"gpus": sizes[0] * (nodes or 1), "gpus_per_node": sizes[0], "nodes": nodes or 1}
    have = " and ".join(str(n) for n in sizes)
    return invalid(
        f"exclusive: pool {pool} has nodes of {have} GPUs, so the job's GPUs would not fill them; "
        f"ask for gpus_per_node={sizes[-1]} (--gres=gpu:{sizes[-1]})"
    )


def shape_problem(ctx: Lookups, spec: JobSubmit, fleets: FleetCache) -> Failure | None:
    gpu_pool = ctx.pools[spec.pool].gpu
    if not gpu_pool:
        return invalid(f"pool {spec.pool} is CPU-only: gpus must be 0") if spec.gpus else None
    if spec.gpus == 0:  # Slurm's default: no GPU unless asked; CPUs and memory on any node
        return None
    if spec.gpus_per_node and spec.nodes and spec.gpus_per_node * spec.nodes != spec.gpus:
        return invalid(f"gpus ({spec.gpus}) != nodes ({spec.nodes}) x gpus_per_node ({spec.gpus_per_node})")
    key = (spec.pool, spec.gpus, spec.gpus_per_node, spec.nodes, spec.gpu_type)
    if key in ctx.shapes:  # same shape earlier in this batch: same answer
        return ctx.shapes[key]
    fleet = ctx.fleets.get(spec.pool)
    if fleet is None:
        fleet = ctx.fleets[spec.pool] = fleets.registered(ctx.s, spec.pool, stale_ok=True)
    problem = _never_fits(fleets.index(spec.pool, fleet), spec)
    if problem is not None and not fleets.is_fresh(spec.pool, fleet):  # confirm on today's fleet
        fleet = ctx.fleets[spec.pool] = fleets.registered(ctx.s, spec.pool)
        problem = _never_fits(fleets.index(spec.pool, fleet), spec)
    if problem is not None and spec.gpu_type and not _has_model(fleet, spec.gpu_type):
        models = [(n.pool, n.model) for n in fleet.nodes] + _models_elsewhere(ctx.s, spec.pool)
        problem = invalid(f"cannot ever run: {no_such_model(spec.gpu_type, spec.pool, models=models)}")
    if problem is not None and mig.wants_slices(spec.gpu_type):  # early, not impossible: it waits
        awaited = layoutwait.load(ctx.s, pool=spec.pool)
        if layoutwait.reason(awaited, pool=spec.pool, gpu_type=spec.gpu_type, gpus=spec.gpus):
            problem = None
    ctx.shapes[key] = problem
    return problem


def _has_model(fleet: Fleet, gpu_type: str) -> bool:
    return any(gpu_type_matches(gpu_type, n.model) for n in fleet.nodes)


def _models_elsewhere(s: Session, pool: str) -> list[tuple[str, str]]:
    """(pool, GPU model) of the other pools: a refused ``gpu_type`` names where it is
    (the pool's own fleet, all a submission loads, cannot say)."""
    q = (
        select(NodeRow.pool, GpuRow.model)
        .join(GpuRow, GpuRow.node == NodeRow.name)
        .where(NodeRow.pool != pool)
    )
    return [(p, m) for p, m in s.execute(q.distinct())]


def _never_fits(index: FleetIndex, spec: JobSubmit) -> Failure | None:
    if not index.fleet.nodes:  # an empty pool: the job waits (Unschedulable) until nodes register
        return None
    req = JobRequest(
        id="submit",
        gpus=spec.gpus,
        submit_time=0.0,
        gpus_per_node=spec.gpus_per_node,
        nodes=spec.nodes,
        gpu_type=spec.gpu_type,
        pool=spec.pool,
    )
    opts = job_options(index, req)
    return invalid(f"cannot ever run: {opts}") if isinstance(opts, str) else None


def fit_gpu_memory(ctx: Lookups, new: NewJob) -> NewJob | Failure:
    """``gpu_memory`` / ``gpu_fraction``: what device the job gets. ``gpu_memory`` alone:
    the smallest MIG slice with that much (its profile's memory, ``gpufleet.mig``'s table:
    isolation in hardware), else a share of a shared GPU with that much (its units:
    the memory's share of the GPU, rounded up), else the smallest whole GPU model of its
    pool with that much. ``gpu_fraction``: a share, of at least that much memory when
    ``gpu_memory`` is given too (the larger of the two shares)."""
    spec = new.spec
    mb = 0
    if spec.gpu_memory is not None:
        if spec.gpu_type is not None:
            return invalid("gpu_memory: give gpu_memory or gpu_type, not both")
        try:
            mb = slurmopts.parse_mem(str(spec.gpu_memory), flag="gpu_memory")
        except ValueError as exc:
            return invalid(str(exc))
    fleet = ctx.fleets.get(spec.pool)
    if fleet is None:
        fleet = ctx.fleets[spec.pool] = new.fleets.registered(ctx.s, spec.pool, stale_ok=True)
    fitted = _fit_on(new, fleet, mb)
    if isinstance(fitted, Failure) and not new.fleets.is_fresh(spec.pool, fleet):
        # confirm on today's fleet: a GPU shared a moment ago is not in a stale one (issue
        # 30: a submit right after `gpufleet node share` was refused)
        fleet = ctx.fleets[spec.pool] = new.fleets.registered(ctx.s, spec.pool)
        fitted = _fit_on(new, fleet, mb)
    return fitted


def _fit_on(new: NewJob, fleet: Fleet, mb: int) -> NewJob | Failure:
    spec = new.spec
    if spec.gpu_fraction is not None:
        return _share(new, fleet, mb)
    best = fit_memory(fleet, spec.pool, mb)
    if best is None:
        return invalid(f"gpu_memory={spec.gpu_memory}: no GPU or MIG slice in pool {spec.pool} has that much")
    if not mig.wants_slices(best) and any(m >= mb for m, _ in shared_models(fleet, spec.pool, spec.gpu_type)):
        return _share(new, fleet, mb)
    shaped = one_node_of_slices(spec.model_copy(update={"gpu_type": best}))
    return shaped if isinstance(shaped, Failure) else dataclasses.replace(new, spec=shaped)


def shared_models(fleet: Fleet, pool: str, gpu_type: str | None) -> list[tuple[int, str]]:
    """(memory MiB, model) of ``pool``'s shared GPUs (of ``gpu_type``), smallest first."""
    found = {
        (n.gpus[0].memory_mb, mig.slice_parent_model(n.gpus[0].model))
        for n in fleet.nodes
        if n.pool == pool and n.gpus and mig.is_share_model(n.gpus[0].model)
    }
    return sorted(f for f in found if gpu_type is None or gpu_type_matches(gpu_type, f[1]))


def _share(new: NewJob, fleet: Fleet, mb: int) -> NewJob | Failure:
    """The job as a share of one shared GPU: ``gpus`` its units (``migindex``), on one node."""
    spec = new.spec
    if spec.gpus != 1 or spec.nodes > 1:
        return invalid("gpu_fraction: a GPU share is part of one GPU (gpus 1, nodes 1)")
    models = shared_models(fleet, spec.pool, spec.gpu_type)
    if not models:
        of = "" if spec.gpu_type is None else f" {spec.gpu_type}"
        return invalid(
            f"pool {spec.pool} has no shared{of} GPUs (an operator shares one with gpufleet node share)"
        )
    fits = [(m, model) for m, model in models if m >= mb]
    if not fits:
        return invalid(f"gpu_memory={spec.gpu_memory}: no shared GPU in pool {spec.pool} has that much")
    memory, model = fits[0]
    units = max(
        math.ceil((spec.gpu_fraction or 0) * mig.SHARE_UNITS), math.ceil(mb * mig.SHARE_UNITS / memory), 1
    )
    if units > mig.SHARE_UNITS:
        return invalid(f"gpu_memory={spec.gpu_memory}: more than a {model} has")
    gpu_type = mig.share_gpu_type(model if mb else spec.gpu_type)
    shaped = spec.model_copy(update={"gpus": units, "gpus_per_node": units, "nodes": 1, "gpu_type": gpu_type})
    return dataclasses.replace(new, spec=shaped)


def fit_memory(fleet: Fleet, pool: str, mb: int) -> str | None:
    """The GPU type of the smallest device of ``pool`` with ``mb`` MiB: "MIG <profile>"
    for a slice, the model for a whole GPU; None when none has that much."""
    found: list[tuple[int, int, str]] = []  # (memory, compute slices, GPU type)
    for n in fleet.nodes:
        if n.pool != pool or not n.gpus or mig.is_share_model(n.gpus[0].model):
            continue  # a share is sized to the memory asked: ``shared_models``
        model = n.gpus[0].model
        if mig.is_slice_model(model):
            parent, profile = mig.slice_parent_model(model), model.rsplit(" ", 1)[-1]
            table = mig.model_for(parent)
            known = None if table is None else table.profiles.get(profile)
            memory = known.memory_mib if known is not None else n.gpus[0].memory_mb
            compute = known.compute_slices if known is not None else mig.COMPUTE_SLICES
            found.append((memory, compute, mig.slice_gpu_type(profile)))
        else:
            found.append((max(g.memory_mb for g in n.gpus), mig.COMPUTE_SLICES + 1, model))
    fits = sorted(f for f in found if f[0] >= mb)
    return fits[0][2] if fits else None
