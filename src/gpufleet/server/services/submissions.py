"""Submitting jobs: validation against pools, memberships, fleets, caps and
reservations, then one group-committed insert with the "submitted" event.

What a submission may claim (403 otherwise), after Slurm, where only operators raise a
priority and only a reservation's users and accounts run in it:

- a priority above 0: operators and admins only, as for ``jobs.set_priority``; 0 or
  below (being nice to others) is anyone's;
- a reservation: its listed users and the members of its team; operators and admins
  may run anything in any reservation (to test or rescue it). Its owner is not
  implicitly one of them: booking for a team or other users leaves the owner out
  unless listed (the scheduler's ``Reservation.owns`` reads the same lists). Checked
  at submission, like Slurm; a later change of membership does not evict a job.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from gpufleet import constraint, mig, slurmopts
from gpufleet.api.jobs import JobDetail, JobEventOut, JobSubmit
from gpufleet.arrayspec import ArraySpec, parse_array
from gpufleet.scheduler import Fleet, JobRequest, deps
from gpufleet.scheduler.capacity import FleetIndex
from gpufleet.scheduler.core import gpu_type_matches, job_options
from gpufleet.scheduler.deps import Dependency
from gpufleet.scheduler.options import no_such_model
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import event_row
from gpufleet.server.problems import Failure, forbidden, invalid
from gpufleet.server.services import layoutwait
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.caps import PendingCounts
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.store.models import DEFAULT_POOL, GpuRow, Job, NodeRow, ReservationRow, Team
from gpufleet.server.store.writer import Writer, call
from gpufleet.timefmt import parse_duration

Waker = Callable[[], None]
MAX_TIME_LIMIT_S = 365 * 86400.0

# Submission's statements, built once (Core, not ORM: see ``insert_jobs``).
_T = Job.metadata.tables
_POOLS_Q = select(
    _T["pools"].c.name,
    _T["pools"].c.gpu,
    _T["pools"].c.default_cpus_per_gpu,
    _T["pools"].c.default_mem_per_cpu_mb,
    _T["pools"].c.is_default,
)  # all of them: a handful of rows, and a job naming none goes to the default one
_QOS_Q = select(_T["qos"].c.name, _T["qos"].c.is_default)
_LICENSES_Q = select(_T["licenses"].c.name, _T["licenses"].c.count)
_TEAMS_Q = (
    select(_T["memberships"].c.user_id, _T["teams"].c.name, _T["teams"].c.id, _T["memberships"].c.is_default)
    .join(_T["teams"], _T["teams"].c.id == _T["memberships"].c.team_id)
    .where(_T["memberships"].c.user_id.in_(bindparam("users", expanding=True)))
)
_INSERT_JOBS = insert(_T["jobs"]).returning(_T["jobs"].c.id, sort_by_parameter_order=True)
_INSERT_EVENTS = insert(_T["job_events"])
_SET_ARRAY = (
    update(_T["jobs"]).where(_T["jobs"].c.id == bindparam("jid")).values(array_job_id=bindparam("array"))
)


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


def _backoff(value: str | float) -> float | Failure:
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
    the pool's defaults are applied in it (``_resources``)."""

    tasks_per_node: int = 0
    cpus_per_task: int = 0
    cpus_per_node: int = 0  # 0: not asked (the pool's default applies)
    mem: tuple[str, int] | None = None  # ("node" | "cpu" | "gpu", MiB); ("all", 0): --mem=0
    begin_at: float | None = None
    deadline: float | None = None
    signal: str | None = None


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
        given, mem = [], ("all", 0)  # Slurm's --mem=0: all of each node's memory (``whole_nodes``)
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
    )


def _resources(new: NewJob, pool: PoolDefaults) -> tuple[int, int]:
    """(CPUs, MiB) the job holds on each of its nodes, the pool's defaults applied."""
    spec, opts = new.spec, new.options
    per_node_gpus = spec.gpus_per_node or (spec.gpus // spec.nodes if spec.nodes else spec.gpus)
    cpus = opts.cpus_per_node
    if not cpus:
        cpus = pool.cpus_per_gpu * per_node_gpus if spec.gpus else 1
    if opts.mem is None:
        mem = pool.mem_per_cpu_mb * cpus
    else:
        kind, mb = opts.mem
        mem = mb if kind == "node" else mb * (cpus if kind == "cpu" else max(1, per_node_gpus))
    return cpus, min(mem, slurmopts.MAX_MEM_MB)


@dataclass(frozen=True, slots=True)
class PoolDefaults:
    gpu: bool
    cpus_per_gpu: int = 0
    mem_per_cpu_mb: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """One validated-so-far submission waiting in the group-commit queue."""

    actor: Principal
    spec: JobSubmit
    time_limit_s: float | None
    now: float
    fleets: FleetCache
    backoff_s: float = 10.0
    pending: PendingCounts | None = None
    """The per-user cap on queued jobs (``services/caps.py``); None: no cap."""
    array: ArraySpec | None = None
    dependency: Dependency | None = None
    options: BatchOptions = field(default_factory=lambda: BatchOptions())


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ctx:
    """What a batch of submissions looked up once, in its transaction."""

    s: Session
    pools: dict[str, PoolDefaults]
    teams: dict[int, dict[str, int]]  # user id -> {team name: team id}
    defaults: dict[int, str] = field(default_factory=dict)  # user id -> their default team
    fleets: dict[str, Fleet] = field(default_factory=dict)
    shapes: dict[tuple[object, ...], Failure | None] = field(default_factory=dict)
    default_pool: str = DEFAULT_POOL
    """Where a job that names no pool goes (``Pool.is_default``, else ``default``)."""
    qos: dict[str, bool] = field(default_factory=dict)
    """The QOS there are: name -> whether it is the default."""
    licenses: dict[str, int] = field(default_factory=dict)
    """The licenses declared (read only when a job of the batch names one)."""

    def fleet(self, new: NewJob, pool: str) -> Fleet:
        """``pool``'s registered fleet, loaded once per batch (a recent one will do)."""
        fleet = self.fleets.get(pool)
        if fleet is None:
            fleet = self.fleets[pool] = new.fleets.registered(self.s, pool, stale_ok=True)
        return fleet


def _counted(spec: JobSubmit) -> JobSubmit:
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


def _license_problem(ctx: _Ctx, wanted: dict[str, int]) -> Failure | None:
    """Slurm's "Invalid license specification": a license no operator declared, or more
    than there are (the job could never start)."""
    for name, n in sorted(wanted.items()):
        have = ctx.licenses.get(name)
        if have is None:
            known = ", ".join(sorted(ctx.licenses)) or "none (gpufleet admin license set NAME COUNT)"
            return invalid(f"licenses: invalid license specification: {name} (licenses: {known})")
        if n > have:
            return invalid(f"licenses: {name}:{n} is more than there are ({have})")
    return None


def _with_qos(ctx: _Ctx, new: NewJob) -> NewJob | Failure:
    """The job's QOS: the one it names (Slurm's "Invalid qos specification" for one that
    does not exist), else the default QOS, else none."""
    name = new.spec.qos
    if name is None:
        name = next((q for q, default in ctx.qos.items() if default), None)
    elif name not in ctx.qos:
        known = ", ".join(sorted(ctx.qos)) or "none (gpufleet admin qos create)"
        return invalid(f"qos: invalid qos specification: {name} (QOS: {known})")
    if name == new.spec.qos:
        return new
    return dataclasses.replace(new, spec=new.spec.model_copy(update={"qos": name}))


def _choose_pool(ctx: _Ctx, new: NewJob) -> NewJob | Failure:
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
            problem = _feature_problem(ctx, shaped)  # its device is fitted later, in the pool chosen
            if problem is None:
                return shaped
            first = first or problem
            continue
        problem = (
            shaped
            if isinstance(shaped, Failure)
            else _feature_problem(ctx, shaped) or _shape_problem(ctx, shaped.spec, new.fleets)
        )
        if problem is None and not isinstance(shaped, Failure):
            return shaped
        first = first or problem
    assert first is not None
    return first


def _feature_problem(ctx: _Ctx, new: NewJob) -> Failure | None:
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


def _whole_nodes(ctx: _Ctx, new: NewJob) -> NewJob | Failure:
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


def _team_for(ctx: _Ctx, actor: Principal, team: str | None) -> tuple[int, str] | Failure:
    mine = ctx.teams.get(actor.user_id, {})
    if team is None:  # Slurm's rule: the user's default account, else the only one
        default = ctx.defaults.get(actor.user_id)
        if default is not None and default in mine:
            return mine[default], default
        if len(mine) == 1:
            name, tid = next(iter(mine.items()))
            return tid, name
        if not mine:
            return invalid(
                "team: you belong to no team; an admin adds you to one (gpufleet admin add-member)"
            )
        return invalid(
            f"team: you belong to teams {', '.join(sorted(mine))} and have no default team: pass one "
            "(--team), or set your default (gpufleet default-team TEAM)"
        )
    if team in mine:
        return mine[team], team
    if actor.is_admin:
        found = ctx.s.scalar(select(Team.id).where(Team.name == team))
        if found is not None:
            return found, team
        return invalid(f"team: no team {team}")
    return forbidden(f"you are not a member of team {team}")


def _shape_problem(ctx: _Ctx, spec: JobSubmit, fleets: FleetCache) -> Failure | None:
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


def _reservation_problem(ctx: _Ctx, new: NewJob) -> Failure | None:
    """A job may name only a booked reservation that has not ended, and only one of its
    people may (see the module's docstring): the scheduler places a job that names a
    reservation in it, whoever submitted it."""
    rid = new.spec.reservation
    if rid is None:
        return None
    row = ctx.s.get(ReservationRow, rid)
    if row is None or row.state != "BOOKED" or row.end <= new.now:
        return invalid(f"reservation: no booked reservation {rid} that has not ended")
    who = new.actor
    if who.is_operator or who.name in row.users:
        return None
    if row.team is not None and row.team in ctx.teams.get(who.user_id, {}):
        return None
    people = "its users" + (f" and members of team {row.team}" if row.team is not None else "")
    return forbidden(f"reservation {rid}: only {people} (or an operator) may run jobs in it")


def _dependency_problem(ctx: _Ctx, new: NewJob) -> Failure | None:
    """Every job a dependency names must exist and be the submitter's own (an operator
    may name anyone's): depending on another user's job would tell its state."""
    dep = new.dependency
    if dep is None:
        return None
    refs = dep.refs
    ids = sorted({r.job for r in refs})
    if not ids:
        return None
    jobs = _T["jobs"]
    found: dict[int, int] = {}  # job id -> owner
    arrays: dict[tuple[int, int], int] = {}  # (array id, task) -> owner
    rows = ctx.s.connection().execute(
        select(jobs.c.id, jobs.c.user_id, jobs.c.array_job_id, jobs.c.array_task_id).where(
            jobs.c.id.in_(ids) | jobs.c.array_job_id.in_(ids)
        )
    )
    for jid, uid, array, task in rows:
        found[jid] = uid
        if array is not None and task is not None:
            arrays[(array, task)] = uid
    mine = new.actor.user_id
    for r in refs:
        owner = found.get(r.job) if r.task is None else arrays.get((r.job, r.task))
        if owner is None or (owner != mine and not new.actor.is_operator):
            return invalid(f"dependency: no job {r} of yours")
    return None


def _rows(new: NewJob, team_id: int, pool: PoolDefaults) -> list[dict[str, Any]]:
    """One row, or one per task of an array (``array_job_id`` is set after the insert)."""
    row = _row(new, team_id)
    row["cpus_per_node"], row["mem_per_node_mb"] = _resources(new, pool)
    if new.array is None:
        return [row]
    ix = new.array.indices
    info = {"count": len(ix), "min": ix[0], "max": ix[-1]}
    return [row | {"array_task_id": i, "array_limit": new.array.limit, "array_info": info} for i in ix]


def _row(new: NewJob, team_id: int) -> dict[str, Any]:
    spec = new.spec
    return {
        "name": spec.name or spec.command[0].rsplit("/", 1)[-1][:128],
        "user_id": new.actor.user_id,
        "team_id": team_id,
        "pool": spec.pool,
        "gpus": spec.gpus,
        "gpus_per_node": spec.gpus_per_node,
        "nodes": spec.nodes,
        "gpu_type": spec.gpu_type,
        "priority": spec.priority,
        "time_limit_s": new.time_limit_s,
        "command": list(spec.command),
        "env": dict(spec.env),
        "image": spec.image,
        "requeue": spec.requeue,
        "max_attempts": spec.max_attempts,
        "attempts": 0,
        "requeue_backoff_s": new.backoff_s,
        "output": spec.output,
        "error": spec.error,
        "reservation_id": spec.reservation,
        "state": str(JobState.HELD if spec.hold else JobState.PENDING),
        "version": 0,
        "submit_time": new.now,
        "pending_since": new.now,
        "attained_service_s": 0.0,
        "executed_s": 0.0,
        "array_job_id": None,
        "array_task_id": None,
        "array_limit": 0,
        "array_info": None,
        "dependency": None if new.dependency is None else str(new.dependency),
        "kill_on_invalid_dep": spec.kill_on_invalid_dep,
        "submit_dir": spec.submit_dir,
        "workdir": spec.workdir,
        "input": spec.input,
        "signal": new.options.signal,
        "cpus_per_task": new.options.cpus_per_task,
        "ntasks_per_node": new.options.tasks_per_node,
        "cpus_per_node": 0,
        "mem_per_node_mb": 0,
        "begin_at": new.options.begin_at,
        "deadline": new.options.deadline,
        "max_price": spec.max_price,
        "exclude": sorted(set(spec.exclude)) if spec.exclude else None,
        "constraint": spec.constraint,
        "qos": spec.qos,
        "licenses": dict(spec.licenses) if spec.licenses else None,
    }


def insert_jobs(s: Session, batch: Sequence[NewJob]) -> list[JobDetail | Failure]:
    """The group-commit ``BulkOp`` of submissions: check every job against the pools,
    memberships and fleets of this transaction (one query each per batch, not per job),
    then insert the valid ones and their "submitted" events with two multi-row INSERTs
    (prepared Core statements: this is the API's hottest path). A refused job is a
    Failure and writes nothing."""
    conn = s.connection()
    pools: dict[str, PoolDefaults] = {}
    default_pool = DEFAULT_POOL
    for name, gpu, cpg, mpc, is_default in conn.execute(_POOLS_Q):
        pools[name] = PoolDefaults(gpu=gpu, cpus_per_gpu=cpg or 0, mem_per_cpu_mb=mpc or 0)
        if is_default:
            default_pool = name
    teams: dict[int, dict[str, int]] = {}
    defaults: dict[int, str] = {}
    users = list({n.actor.user_id for n in batch})
    for uid, name, tid, is_default in conn.execute(_TEAMS_Q, {"users": users}):
        teams.setdefault(uid, {})[name] = tid
        if is_default:
            defaults[uid] = name
    qos = dict(conn.execute(_QOS_Q).tuples().all())
    licenses = dict(conn.execute(_LICENSES_Q).tuples().all()) if any(n.spec.licenses for n in batch) else {}
    ctx = _Ctx(
        s=s,
        pools=pools,
        teams=teams,
        defaults=defaults,
        default_pool=default_pool,
        qos=qos,
        licenses=licenses,
    )
    out: list[Failure | None] = []  # None: accepted
    rows: list[dict[str, Any]] = []
    accepted: list[tuple[int, NewJob, str, list[dict[str, Any]]]] = []
    for new in batch:
        team = _team_for(ctx, new.actor, new.spec.team)
        if isinstance(team, Failure):
            out.append(team)
            continue
        placed = _choose_pool(ctx, new)
        if isinstance(placed, Failure):
            out.append(placed)
            continue
        qosed = _with_qos(ctx, placed)
        if isinstance(qosed, Failure):
            out.append(qosed)
            continue
        if qosed.spec.licenses and (short := _license_problem(ctx, qosed.spec.licenses)) is not None:
            out.append(short)
            continue
        new = qosed
        if new.spec.gpu_memory is not None or new.spec.gpu_fraction is not None:
            fitted = _fit_gpu_memory(ctx, new)
            if isinstance(fitted, Failure):
                out.append(fitted)
                continue
            new = fitted
        problem = (
            _shape_problem(ctx, new.spec, new.fleets)
            or _feature_problem(ctx, new)
            or _reservation_problem(ctx, new)
            or _dependency_problem(ctx, new)
        )
        mine = _rows(new, team[0], pools[new.spec.pool]) if problem is None else []
        if problem is None and new.pending is not None:  # last: it counts the jobs as accepted
            who = new.actor
            problem = new.pending.admit(s, user_id=who.user_id, name=who.name, role=who.role, jobs=len(mine))
        if problem is not None:
            out.append(problem)
            continue
        accepted.append((len(out), new, team[1], mine))
        out.append(None)
        rows += mine
    if not rows:
        return [f for f in out if f is not None]
    ids = iter(conn.execute(_INSERT_JOBS, rows).scalars().all())
    events: list[dict[str, Any]] = []
    details: dict[int, JobDetail] = {}
    for at, new, team_name, mine in accepted:
        actor = new.actor.name
        first: tuple[int, dict[str, Any], dict[str, Any]] | None = None
        tasks: list[int] = []
        for row in mine:
            job_id = next(ids)
            why = "submitted" if new.array is None else f"submitted (task {row['array_task_id']} of an array)"
            why += " held" if new.spec.hold else ""
            dst = JobState.HELD if new.spec.hold else JobState.PENDING
            ev = event_row(job_id=job_id, at=new.now, actor=actor, src=None, dst=dst, reason=why)
            events.append(ev)
            tasks.append(job_id)
            if first is None:
                first = (job_id, row, ev)
        assert first is not None
        if new.array is not None:  # the array's id is its first task's (Slurm's ArrayJobId)
            conn.execute(_SET_ARRAY, [{"jid": jid, "array": tasks[0]} for jid in tasks])
            first[1]["array_job_id"] = tasks[0]
        details[at] = _submitted(first[0], first[1], user=actor, team=team_name, event=first[2])
    conn.execute(_INSERT_EVENTS, events)
    return [details[i] if f is None else f for i, f in enumerate(out)]


def _submitted(job_id: int, row: dict[str, Any], *, user: str, team: str, event: dict[str, Any]) -> JobDetail:
    """The reply to a submit, from the values just inserted (validated on the way in:
    ``model_construct`` skips validating them a second time)."""
    return JobDetail.model_construct(
        id=job_id,
        name=row["name"],
        user=user,
        team=team,
        pool=row["pool"],
        state=row["state"],
        gpus=row["gpus"],
        gpus_per_node=row["gpus_per_node"],
        nodes=row["nodes"],
        gpu_type=row["gpu_type"],
        priority=row["priority"],
        time_limit_s=row["time_limit_s"],
        command=row["command"],
        image=row["image"],
        requeue=row["requeue"],
        max_attempts=row["max_attempts"],
        attempts=0,
        submit_time=row["submit_time"],
        scheduled_at=None,
        started_at=None,
        ended_at=None,
        exit_code=None,
        attained_service_s=0.0,
        queue_position=None,
        estimated_start=None,
        wait_reason=None,
        allocation=[],
        reservation=row["reservation_id"],
        cost=0.0,
        energy_kwh=0.0,
        # Every field given: a default_factory left to ``model_construct`` makes pydantic
        # inspect the factory's signature per call (a third of the writer's CPU per job).
        warnings=[],
        env=row["env"],
        output=row["output"],
        error=row["error"],
        events=[JobEventOut.model_construct(**{k: event[k] for k in JobEventOut.model_fields})],
        array_job_id=row["array_job_id"],
        array_task_id=row["array_task_id"],
        dependency=row["dependency"],
        cpus_per_node=row["cpus_per_node"],
        mem_per_node_mb=row["mem_per_node_mb"],
        begin_at=row["begin_at"],
        deadline=row["deadline"],
        max_price=row["max_price"],
        qos=row["qos"],
        licenses=row["licenses"],
        input=row["input"],
        submit_dir=row["submit_dir"],
        workdir=row["workdir"],
        signal=row["signal"],
        cpus_per_task=row["cpus_per_task"],
        ntasks_per_node=row["ntasks_per_node"],
    )


def _fit_gpu_memory(ctx: _Ctx, new: NewJob) -> NewJob | Failure:
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


async def submit(
    *,
    writer: Writer,
    actor: Principal,
    spec: JobSubmit,
    now: float,
    fleets: FleetCache,
    waker: Waker,
    budget_warning: Callable[[str], str | None] = lambda team: None,
    pending: PendingCounts | None = None,
) -> JobDetail | Failure:
    """Validate and insert in one transaction (shared with concurrent submits through
    the group-commit ``writer``); returns once committed, without holding a thread
    while it waits. The reply warns when the job's team is over its soft budget.
    ``pending``: the per-user cap on queued jobs (403 past it)."""
    if spec.priority > 0 and not actor.is_operator:
        return forbidden(
            f"priority {spec.priority}: only operators and admins give a job a priority above 0 "
            "(0 or below is anyone's)"
        )
    spec = _counted(spec)
    if spec.constraint is not None:
        try:
            spec = spec.model_copy(update={"constraint": str(constraint.parse(spec.constraint))})
        except ValueError as exc:
            return invalid(f"constraint: {exc}")
    shaped = one_node_of_slices(spec)
    if isinstance(shaped, Failure):
        return shaped
    spec = shaped
    limit = time_limit(spec.time_limit)
    if isinstance(limit, Failure):
        return limit
    backoff = _backoff(spec.requeue_backoff)
    if isinstance(backoff, Failure):
        return backoff
    try:
        array = None if spec.array is None else parse_array(spec.array)
    except ValueError as exc:
        return invalid(f"array: {exc}")
    try:
        dependency = None if spec.dependency is None else deps.parse(spec.dependency)
    except deps.DependencyError as exc:
        return invalid(f"dependency: {exc}")
    options = batch_options(spec, now=now, time_limit_s=limit)
    if isinstance(options, Failure):
        return options
    new = NewJob(
        actor=actor,
        options=options,
        spec=spec,
        time_limit_s=limit,
        now=now,
        fleets=fleets,
        backoff_s=backoff,
        pending=pending,
        array=array,
        dependency=dependency,
    )
    out = await call(writer, insert_jobs, new)
    if isinstance(out, Failure):
        return out
    waker()
    warning = budget_warning(out.team)
    return out if warning is None else out.model_copy(update={"warnings": [warning]})
