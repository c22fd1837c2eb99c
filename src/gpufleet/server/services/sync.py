"""The server half of DESIGN.md's agent protocol: ``POST /v1/nodes/{name}/sync``.

An agent sends what it observes (inventory, telemetry, the state of each job attempt it
holds, new log bytes); the answer is the set of job attempts the node should run, plus
how much of each log the server has. It is idempotent: replaying a message, losing an
answer or restarting either side leaves the same state and gives the same answer.

Observations, in order (passive first, like the scheduling loop):

- ``running`` for a SCHEDULED job of this attempt -> RUNNING;
- ``exited`` for a SCHEDULED/RUNNING job of this attempt -> COMPLETED (0) / FAILED;
- ``lost`` (the attempt vanished without an exit code: its node restarted) -> requeued
  (``requeue.py``; this node needs no further stop confirmation);
- a job told to stop here (``stopping_on``) that the node no longer reports running is
  confirmed stopped (it may then be placed again);
- an observation about an older attempt changes no job state (but a still-running old
  attempt keeps its stop unconfirmed).

A sync that would change nothing durable (the steady state of an idle or busy fleet) is
answered from a read transaction; its heartbeat goes to ``HotState.heartbeats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpufleet.server import accounting
from gpufleet.server.db import Database
from gpufleet.server.hot import HotState
from gpufleet.server.models import Allocation, GpuRow, Job, JobLogChunk, NodeRow, User
from gpufleet.server.problems import Failure, conflict, forbidden, not_found
from gpufleet.server.requeue import Conflict, requeue
from gpufleet.server.schemas import DesiredJob, GpuIn, LogAck, NodeSync, ObservedJob, PeerNode, SyncReply
from gpufleet.server.services.nodes import _check_gpus, _set_gpus
from gpufleet.server.states import ACTIVE, TERMINAL, JobState
from gpufleet.server.transitions import move, ref, stop_values
from gpufleet.server.writer import Writer

Waker = Callable[[], None]
PORT_BASE = 20_000
PORT_SPAN = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentActor:
    """Who syncs: ``node`` is the one node a node credential speaks for (None: an
    operator or admin token, which may speak for any node)."""

    name: str
    node: str | None
    credential_id: int | None = None
    """The join token it authenticated with, if that is how (recorded with a certificate)."""


def attempt_of(scheduled_at: float | None) -> int:
    """A job attempt's id: its placement time in milliseconds (unique per job, since a
    job is placed again only after its previous attempt was confirmed stopped)."""
    return round((scheduled_at or 0.0) * 1000)


def master_port(job_id: int) -> int:
    return PORT_BASE + job_id % PORT_SPAN


class _Retry(Exception):
    pass


# -- what the node should run ------------------------------------------------------------------


def _desired(s: Session, node: str) -> list[DesiredJob]:
    q = (
        select(Job, User.name)
        .join(Allocation, Allocation.job_id == Job.id)
        .join(User, User.id == Job.user_id)
        .where(Allocation.node == node, Job.state.in_([str(a) for a in ACTIVE]))
        .order_by(Job.id)
    )
    jobs: dict[int, tuple[Job, str]] = {}
    for job, user in s.execute(q):
        jobs.setdefault(job.id, (job, user))
    if not jobs:
        return []
    placement: dict[int, dict[str, list[int]]] = {jid: {} for jid in jobs}
    aq = (
        select(Allocation.job_id, Allocation.node, Allocation.gpu_index)
        .where(Allocation.job_id.in_(jobs))
        .order_by(Allocation.id)
    )
    for jid, n, idx in s.execute(aq):
        gpus = placement[jid].setdefault(n, [])
        if idx is not None:
            gpus.append(idx)
    names = {n for p in placement.values() for n in p}
    addresses = dict(s.execute(select(NodeRow.name, NodeRow.address).where(NodeRow.name.in_(names))).all())
    return [_desired_job(job, user, node, placement[jid], addresses) for jid, (job, user) in jobs.items()]


def _desired_job(
    job: Job, user: str, node: str, placement: dict[str, list[int]], addresses: dict[str, str | None]
) -> DesiredJob:
    """The placement's first node is the master; every node gets its rank in it."""
    peers = [PeerNode(node=n, address=addresses.get(n) or n, gpus=sorted(g)) for n, g in placement.items()]
    return DesiredJob(
        job_id=job.id,
        attempt=attempt_of(job.scheduled_at),
        name=job.name,
        command=job.command,
        env=job.env,
        image=job.image,
        gpus=sorted(placement.get(node, [])),
        time_limit_s=job.time_limit_s,
        deadline=None
        if job.time_limit_s is None or job.started_at is None
        else job.started_at + job.time_limit_s,
        user=user,
        output=job.output,
        error=job.error,
        nodes=peers,
        node_rank=[p.node for p in peers].index(node),
        master_addr=peers[0].address,
        master_port=master_port(job.id),
        world_size=max(1, sum(len(p.gpus) for p in peers)),
    )


# -- observations --------------------------------------------------------------------------------


def _current(o: ObservedJob, job: Job) -> bool:
    return o.attempt is None or o.attempt == attempt_of(job.scheduled_at)


def _transition(o: ObservedJob, job: Job) -> JobState | None:
    """The move an observation asks for, None if it changes nothing."""
    if not _current(o, job):
        return None
    st = JobState(job.state)
    if o.state == "running" and st == JobState.SCHEDULED:
        return JobState.RUNNING
    if o.state == "lost" and st in ACTIVE:
        return JobState.REQUEUED
    if o.state == "exited" and st in ACTIVE:
        return JobState.COMPLETED if (o.exit_code or 0) == 0 and o.exit_code is not None else JobState.FAILED
    return None


def _stops_confirmed(s: Session, node: str, seen: dict[int, ObservedJob]) -> list[Job]:
    q = select(Job).where(Job.stopping_on.is_not(None), Job.stopping_on.contains(node))
    return [
        job
        for job in s.scalars(q)
        if node in (job.stopping_on or "").split(",")
        and not (job.id in seen and seen[job.id].state == "running")
    ]


def _mine(s: Session, node: str, seen: dict[int, ObservedJob]) -> list[Job]:
    if not seen:
        return []
    here = select(Allocation.job_id).where(Allocation.node == node)
    return list(s.scalars(select(Job).where(Job.id.in_(seen), Job.id.in_(here))))


def _observe(
    s: Session, node: str, body: NodeSync, actor: str, now: float, readings: accounting.Readings
) -> bool:
    """Apply the observations; True if a job changed. Raises _Retry on a lost CAS."""
    changed = False
    seen = {o.job_id: o for o in body.jobs}
    for job in _mine(s, node, seen):
        o = seen[job.id]
        to = _transition(o, job)
        if to is None:
            continue
        if to == JobState.REQUEUED:
            try:
                requeue(s, job, now=now, actor=actor, reason=f"attempt vanished on {node}", lost=(node,))
            except Conflict:
                raise _Retry from None
            changed = True
            continue
        if to == JobState.RUNNING:
            values = {"started_at": now}
            reason = f"running on {node}"
        else:
            code = o.exit_code if o.exit_code is not None else -1
            values = stop_values(s, job, now=now, confirmed=True, readings=readings) | {"exit_code": code}
            reason = f"exited with code {code} on {node}"
        if not move(s, ref(job), to, actor=actor, reason=reason, now=now, values=values):
            raise _Retry
        changed = True
    for job in _stops_confirmed(s, node, seen):
        rest = [n for n in (job.stopping_on or "").split(",") if n and n != node]
        job.stopping_on = ",".join(rest) or None
        changed = True
    return changed


def _would_change(s: Session, node: str, body: NodeSync) -> bool:
    seen = {o.job_id: o for o in body.jobs}
    if any(_transition(seen[j.id], j) is not None for j in _mine(s, node, seen)):
        return True
    return bool(_stops_confirmed(s, node, seen))


# -- logs ----------------------------------------------------------------------------------------


def _may_log(job: Job, node: str, attempt: int, allocated: set[int]) -> bool:
    if job.id in allocated:
        return True
    if node in (job.stopping_on or "").split(","):
        return True
    return JobState(job.state) in TERMINAL | {JobState.PENDING} and attempt == attempt_of(job.scheduled_at)


def _ingest_logs(s: Session, node: str, body: NodeSync, now: float) -> list[LogAck]:
    if not body.logs:
        return []
    ids = {c.job_id for c in body.logs}
    jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))}
    allocated = set(s.scalars(select(Allocation.job_id).where(Allocation.node == node)))
    ends: dict[tuple[int, int], int] = {}
    rows: list[dict[str, object]] = []
    for c in body.logs:
        job = jobs.get(c.job_id)
        if job is None or not _may_log(job, node, c.attempt, allocated):
            continue
        key = (c.job_id, c.attempt)
        if key not in ends:
            ends[key] = int(
                s.scalar(
                    select(func.coalesce(func.max(JobLogChunk.end), 0)).where(
                        JobLogChunk.job_id == c.job_id,
                        JobLogChunk.attempt == c.attempt,
                        JobLogChunk.node == node,
                    )
                )
                or 0
            )
        if c.offset == ends[key] and c.end > c.offset:
            rows.append(
                {
                    "job_id": c.job_id,
                    "attempt": c.attempt,
                    "node": node,
                    "offset": c.offset,
                    "end": c.end,
                    "data": c.data,
                    "at": now,
                }
            )
            ends[key] = c.end
    if rows:
        s.execute(insert(JobLogChunk), rows)
    return [LogAck(job_id=j, attempt=a, end=e) for (j, a), e in sorted(ends.items())]


# -- the endpoint ----------------------------------------------------------------------------------


_STORED_GPUS = (
    select(GpuRow.index, GpuRow.uuid, GpuRow.model, GpuRow.memory_mb, GpuRow.nvlink_domain, GpuRow.healthy)
    .where(GpuRow.node == bindparam("node"))
    .order_by(GpuRow.index)
)
_NODE = select(NodeRow.last_seen, NodeRow.leaf, NodeRow.rack, NodeRow.address).where(
    NodeRow.name == bindparam("node")
)


_JOB_HERE = select(Allocation.id).where(Allocation.node == bindparam("node")).limit(1)
"""Allocations exist only for SCHEDULED/RUNNING jobs (``stop_values`` deletes them)."""
_STOPPING = (
    select(Job.id).where(Job.stopping_on.is_not(None), Job.stopping_on.like(bindparam("like"))).limit(1)
)


def _same_gpus(s: Session, node: str, gpus: Sequence[GpuIn]) -> bool:
    stored = [tuple(r) for r in s.connection().execute(_STORED_GPUS, {"node": node})]
    sent = sorted((g.index, g.uuid, g.model, g.memory_mb, g.nvlink_domain, g.healthy) for g in gpus)
    return stored == sent


class _Placed(Protocol):
    """Where a node is (a NodeRow, or a row of ``_NODE``)."""

    @property
    def leaf(self) -> str | None: ...
    @property
    def rack(self) -> str | None: ...
    @property
    def address(self) -> str | None: ...


def _node_differs(n: _Placed, body: NodeSync) -> bool:
    return any(
        new is not None and new != old
        for new, old in ((body.leaf, n.leaf), (body.rack, n.rack), (body.address, n.address))
    )


def _fast_reply(db: Database, name: str, body: NodeSync) -> SyncReply | None:
    """The answer when this sync changes nothing durable, else None. Most syncs of a
    fleet end here (a heartbeat and telemetry): plain Core statements, no ORM objects
    unless the node runs jobs."""
    if body.logs:
        return None
    with db.read() as s:
        n = s.connection().execute(_NODE, {"node": name}).first()
        if n is None or n.last_seen is None or _node_differs(n, body):
            return None
        if body.gpus is not None and not _same_gpus(s, name, body.gpus):
            return None
        c = s.connection()
        busy = c.execute(_JOB_HERE, {"node": name}).first() is not None
        stopping = c.execute(_STOPPING, {"like": f"%{name}%"}).first() is not None
        if (busy or stopping) and _would_change(s, name, body):
            return None
        return SyncReply(node=name, jobs=_desired(s, name) if busy else [])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Written:
    reply: SyncReply
    reshaped: bool
    changed: bool
    first_seen: bool


def _write(
    s: Session, *, name: str, body: NodeSync, actor: str, now: float, readings: accounting.Readings
) -> _Written | Failure:
    """The durable half of a sync, in the caller's transaction (the group commit's
    SAVEPOINT): register or update the node, apply the observations, ingest the logs.
    Raises _Retry on a lost compare-and-set."""
    node = s.get(NodeRow, name)
    if node is None:
        if body.gpus is None:
            return not_found(f"no node {name}: register it or send its gpus")
        node = NodeRow(name=name, created_at=now, pool="default")
        s.add(node)
    was_seen_at = node.last_seen
    reshaped = _node_differs(node, body) or (body.gpus is not None and not _same_gpus(s, name, body.gpus))
    node.last_seen = now
    node.leaf = body.leaf or node.leaf or "leaf-0"
    node.rack = body.rack or node.rack or "rack-0"
    node.address = body.address or node.address
    s.flush()
    if body.gpus is not None and reshaped:
        _set_gpus(s, name, body.gpus)
        s.flush()
    changed = _observe(s, name, body, actor, now, readings)
    acks = _ingest_logs(s, name, body, now)
    s.flush()
    return _Written(
        reply=SyncReply(node=name, jobs=_desired(s, name), log_acks=acks),
        reshaped=reshaped,
        changed=changed,
        first_seen=was_seen_at is None,
    )


def sync_node(
    *,
    db: Database,
    writer: Writer,
    hot: HotState,
    actor: AgentActor,
    name: str,
    body: NodeSync,
    now: float,
    fleets_invalidate: Callable[[], None],
    waker: Waker,
    readings: accounting.Readings = accounting.no_readings,
) -> SyncReply | Failure:
    """Answer one sync. ``readings``: the latest GPU telemetry, for the energy of jobs
    that ended. A sync that changes something durable (a registration, a job
    observation, log bytes, a new address or GPU set) goes through the group-commit
    ``writer``: many agents' writes share one transaction (on SQLite one write lock and
    one fsync per batch instead of per agent), and the reply leaves only after the
    commit."""
    if actor.node is not None and actor.node != name:
        return forbidden(f"this node credential belongs to node {actor.node}, not {name}")
    if body.gpus is not None:
        bad = _check_gpus(body.gpus)
        if bad is not None:
            return bad
    if body.telemetry is not None:
        hot.telemetry.put(
            name,
            at=now,
            gpus=body.telemetry,
            driver_version=body.driver_version,
            cuda_version=body.cuda_version,
        )
        hot.health.observe(name, body.telemetry, now)  # a fired rule wakes the lifecycle loop
    fast = _fast_reply(db, name, body)
    if fast is not None:
        hot.heartbeats.note(name, now)
        hot.heartbeats.maybe_flush(writer)
        return fast
    write = partial(_write, name=name, body=body, actor=actor.name, now=now, readings=readings)
    for _ in range(5):
        try:
            out = writer.run(write)
        except (_Retry, OperationalError):  # a lost CAS, or the commit failed (SQLite busy too long)
            continue
        if isinstance(out, Failure):
            return out
        if out.reshaped:
            fleets_invalidate()
        if out.changed or out.reshaped or out.first_seen:
            waker()
        return out.reply
    return conflict(f"node {name}: the database is busy or its jobs change too fast; sync again")
