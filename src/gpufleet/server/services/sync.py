"""The server half of DESIGN.md's agent protocol: ``POST /v1/nodes/{name}/sync``.

An agent sends what it observes (inventory, telemetry, the state of each job attempt it
holds, new log bytes); the answer is the set of job attempts the node should run, plus
how much of each log the server has. It is idempotent: replaying a message, losing an
answer or restarting either side leaves the same state and gives the same answer.

What a node may speak for (Kubernetes' NodeRestriction: a kubelet may change only its
own Node and the status of the pods bound to it). A sync's job state and log bytes
count only for a job *attempt* (``DesiredJob.attempt``):

- placed on this node (it holds GPUs here) at exactly that attempt, or
- that this node was told to stop (``Job.stopping_on``, attempt ``stopping_attempt``)
  and has not confirmed yet: it still ships that attempt's last output.

Judged on the state before the sync, so a sync that reports an exit and ships the last
bytes in one message keeps them. Everything else (no attempt given, no such job, a job
placed elsewhere or never placed, another attempt) is dropped, item by item, never the
whole sync, and counted (``AgentState.rejected``: ``gpufleet_sync_rejected_items_total``
by kind and reason). Where NodeRestriction is silent: a duplicate the server already
applied (an exit resent after a lost answer) counts like any other dropped item; a node
declared lost needs no stop confirmation (``requeue.py``), so output of an attempt it
still ships after coming back is dropped; an operator's token may speak for any node,
but for the same attempts only.

Observations, in order (passive first, like the scheduling loop):

- ``running`` for a SCHEDULED job of this attempt -> RUNNING;
- ``exited`` for a SCHEDULED/RUNNING job of this attempt -> COMPLETED (0) / FAILED; the
  job's other nodes (a multi-node job) still have to confirm their part stopped;
- ``lost`` (the attempt vanished without an exit code: its node restarted) -> requeued
  (``requeue.py``; this node needs no further stop confirmation);
- a job told to stop here (``stopping_on``) that the node no longer reports running (any
  attempt of it: a node that reports one running keeps the stop unconfirmed, which
  delays only its own job) is confirmed stopped (it may then be placed again).

An inventory that contradicts what the server knows (``nodes.judge_inventory``: a GPU
changing model under a running job, an impossible or repeated index, a repeated UUID,
several models) is not stored: the node is cordoned with the reason and a critical
fleet event (once per reason), its GPU rows stay as they were, and the rest of the
sync is applied and answered. (The kubelet's equivalent, a Node status the control
plane cannot reconcile, leaves the Node NotReady; here the node stays Ready, so its
running jobs keep their heartbeat, but takes nothing new.) A sync naming GPUs no node
can have also has their telemetry dropped.

A sync that would change nothing durable (the steady state of an idle or busy fleet) is
answered from a read transaction; its heartbeat goes to ``AgentState.heartbeats``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from sqlalchemy import bindparam, func, insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpufleet.server import ledger
from gpufleet.server.agentstate import AgentState
from gpufleet.server.db import Database
from gpufleet.server.errors import Conflict
from gpufleet.server.jobstate.requeue import requeue
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.jobstate.transitions import attempt_of, move, ref, release_attempt
from gpufleet.server.models import DEFAULT_POOL, Allocation, GpuRow, Job, JobLogChunk, NodeRow, User
from gpufleet.server.problems import Failure, conflict, forbidden, not_found
from gpufleet.server.schemas import (
    MAX_GPU_INDEX,
    DesiredJob,
    GpuIn,
    LogAck,
    LogChunkIn,
    NodeSync,
    ObservedJob,
    PeerNode,
    SyncReply,
)
from gpufleet.server.services.nodeops import add_event
from gpufleet.server.services.nodes import inventory_problem, set_gpus, write_heartbeats
from gpufleet.server.writer import Writer

log = logging.getLogger("gpufleet.server")
Waker = Callable[[], None]
ACTOR = "sync"
"""The actor of what the server decides on a node's report (its cordon)."""
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


def master_port(job_id: int) -> int:
    return PORT_BASE + job_id % PORT_SPAN


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


# -- what the node may speak for ------------------------------------------------------------


def _nodes(stopping_on: str | None) -> list[str]:
    return [n for n in (stopping_on or "").split(",") if n]


def _why_not(job: Job | None, attempt: int | None, node: str, held: set[int]) -> str | None:
    """None if ``node`` may speak for this attempt of ``job``, else why not (a
    ``hot.REJECT_REASONS`` label)."""
    if attempt is None:
        return "no_attempt"
    if job is None:
        return "unknown_job"
    if job.id in held:
        return None if attempt == attempt_of(job.scheduled_at) else "stale_attempt"
    if node in _nodes(job.stopping_on):
        stopped = job.stopping_attempt
        return None if stopped is None or attempt == stopped else "stale_attempt"
    return "not_assigned"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Scope:
    """A sync's items this node may speak for, judged on the state before the sync."""

    jobs: dict[int, Job]
    """The jobs the sync names that exist."""
    states: list[ObservedJob]
    logs: list[LogChunkIn]
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(kind, reason) -> items dropped."""


def _scope(s: Session, node: str, body: NodeSync) -> _Scope:
    ids = {o.job_id for o in body.jobs} | {c.job_id for c in body.logs}
    if not ids:
        return _Scope(jobs={}, states=[], logs=[])
    here = select(Allocation.id).where(Allocation.job_id == Job.id, Allocation.node == node).exists()
    jobs: dict[int, Job] = {}
    held: set[int] = set()
    for job, is_here in s.execute(select(Job, here).where(Job.id.in_(ids))):
        jobs[job.id] = job
        if is_here:
            held.add(job.id)
    out = _Scope(jobs=jobs, states=[], logs=[])
    for o in body.jobs:
        why = _why_not(jobs.get(o.job_id), o.attempt, node, held)
        if why is None:
            out.states.append(o)
        else:
            out.rejected[("state", why)] += 1
    for c in body.logs:
        why = _why_not(jobs.get(c.job_id), c.attempt, node, held)
        if why is None:
            out.logs.append(c)
        else:
            out.rejected[("log", why)] += 1
    return out


# -- observations --------------------------------------------------------------------------------


def _transition(o: ObservedJob, job: Job) -> JobState | None:
    """The move an observation the node may make asks for, None if it changes nothing
    (an attempt being stopped has left SCHEDULED/RUNNING already)."""
    st = JobState(job.state)
    if o.state == "running" and st == JobState.SCHEDULED:
        return JobState.RUNNING
    if o.state == "lost" and st in ACTIVE:
        return JobState.REQUEUED
    if o.state == "exited" and st in ACTIVE:
        return JobState.COMPLETED if (o.exit_code or 0) == 0 and o.exit_code is not None else JobState.FAILED
    return None


def _stops_confirmed(s: Session, node: str, body: NodeSync) -> list[Job]:
    """Jobs told to stop here that the node reports running no attempt of."""
    running = {o.job_id for o in body.jobs if o.state == "running"}
    q = select(Job).where(Job.stopping_on.is_not(None), Job.stopping_on.contains(node))
    return [job for job in s.scalars(q) if node in _nodes(job.stopping_on) and job.id not in running]


def _latest(scope: _Scope) -> list[ObservedJob]:
    """One observation per job (the last: a sync is one moment of the node)."""
    return list({o.job_id: o for o in scope.states}.values())


def _observe(
    s: Session,
    node: str,
    body: NodeSync,
    scope: _Scope,
    actor: str,
    now: float,
    readings: ledger.Readings,
) -> bool:
    """Apply the observations the node may make; True if a job changed. Raises
    ``Conflict`` on a lost CAS."""
    changed = False
    for o in _latest(scope):
        job = scope.jobs[o.job_id]
        to = _transition(o, job)
        if to is None:
            continue
        if to == JobState.REQUEUED:
            requeue(s, job, now=now, actor=actor, reason=f"attempt vanished on {node}", lost=(node,))
            changed = True
            continue
        if to == JobState.RUNNING:
            values = {"started_at": now}
            reason = f"running on {node}"
        else:
            code = o.exit_code if o.exit_code is not None else -1
            values = release_attempt(
                s, job, now=now, confirmed=False, confirmed_on=node, readings=readings
            ) | {"exit_code": code}
            reason = f"exited with code {code} on {node}"
        move(s, ref(job), to, actor=actor, reason=reason, now=now, values=values)
        changed = True
    for job in _stops_confirmed(s, node, body):
        rest = [n for n in _nodes(job.stopping_on) if n != node]
        job.stopping_on = ",".join(rest) or None
        changed = True
    return changed


def _would_change(s: Session, node: str, body: NodeSync, scope: _Scope) -> bool:
    if any(_transition(o, scope.jobs[o.job_id]) is not None for o in _latest(scope)):
        return True
    return bool(_stops_confirmed(s, node, body))


# -- logs ----------------------------------------------------------------------------------------


def _ingest_logs(s: Session, node: str, chunks: Sequence[LogChunkIn], now: float) -> list[LogAck]:
    """Store the chunks (the node may ship all of them: ``_scope``)."""
    if not chunks:
        return []
    ends: dict[tuple[int, int], int] = {}
    rows: list[dict[str, object]] = []
    for c in chunks:
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
                    "data": c.data,  # cleaned of NULs by its schema (``LogChunkIn``)
                    "at": now,
                }
            )
            ends[key] = c.end
    if rows:
        s.execute(insert(JobLogChunk), rows)
    return [LogAck(job_id=j, attempt=a, end=e) for (j, a), e in sorted(ends.items())]


# -- an inventory the server cannot take ------------------------------------------------------


def _quarantine(s: Session, node: NodeRow, why: str, now: float) -> bool:
    """Cordon ``node`` because its inventory was refused (once per reason: a node that
    keeps sending the same one writes one event). True if it changed something."""
    reason = f"inventory refused: {why}"[:256]
    if node.cordoned and node.cordon_reason == reason:
        return False
    node.cordoned, node.cordon_reason = True, reason
    add_event(
        s,
        at=now,
        node=node.name,
        kind="cordoned",
        severity="critical",
        actor=ACTOR,
        reason=f"{reason}; its stored GPUs are kept, nothing new lands on it until an operator uncordons it",
    )
    log.warning("node %s cordoned: %s", node.name, reason)
    return True


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
"""Allocations exist only for SCHEDULED/RUNNING jobs (``release_attempt`` deletes them)."""
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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Answer:
    reply: SyncReply
    rejected: Counter[tuple[str, str]]


def _fast_reply(db: Database, name: str, body: NodeSync) -> _Answer | None:
    """The answer when this sync changes nothing durable, else None. Most syncs of a
    fleet end here (a heartbeat and telemetry): plain Core statements, no ORM objects
    unless the node reports jobs."""
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
        scope = _scope(s, name, body)
        if (busy or stopping) and _would_change(s, name, body, scope):
            return None
        return _Answer(
            reply=SyncReply(node=name, jobs=_desired(s, name) if busy else []), rejected=scope.rejected
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Written(_Answer):
    reshaped: bool
    changed: bool
    first_seen: bool


def _write(
    s: Session, *, name: str, body: NodeSync, actor: str, now: float, readings: ledger.Readings
) -> _Written | Failure:
    """The durable half of a sync, in the caller's transaction (the group commit's
    SAVEPOINT): register or update the node (an inventory it cannot take cordons it
    instead), apply the observations, ingest the logs. Raises ``Conflict`` on a
    lost compare-and-set."""
    node = s.get(NodeRow, name)
    if node is None:
        if body.gpus is None:
            return not_found(f"no node {name}: register it or send its gpus")
        node = NodeRow(name=name, created_at=now, pool=DEFAULT_POOL)
        s.add(node)
    scope = _scope(s, name, body)  # before anything of this sync is applied
    was_seen_at = node.last_seen
    new_gpus = body.gpus is not None and not _same_gpus(s, name, body.gpus)
    reshaped = _node_differs(node, body) or new_gpus
    node.last_seen = now
    node.leaf = body.leaf or node.leaf or "leaf-0"
    node.rack = body.rack or node.rack or "rack-0"
    node.address = body.address or node.address
    s.flush()
    if body.gpus is not None and new_gpus:
        bad = inventory_problem(s, name, body.gpus)
        if bad is None:
            set_gpus(s, name, body.gpus)
        elif not _quarantine(s, node, bad.reason, now):
            reshaped = _node_differs(node, body)  # the same refusal again: nothing new
        s.flush()
    changed = _observe(s, name, body, scope, actor, now, readings)
    acks = _ingest_logs(s, name, scope.logs, now)
    s.flush()
    return _Written(
        reply=SyncReply(node=name, jobs=_desired(s, name), log_acks=acks),
        rejected=scope.rejected,
        reshaped=reshaped,
        changed=changed,
        first_seen=was_seen_at is None,
    )


def sync_node(
    *,
    db: Database,
    writer: Writer,
    hot: AgentState,
    actor: AgentActor,
    name: str,
    body: NodeSync,
    now: float,
    fleets_invalidate: Callable[[], None],
    waker: Waker,
    readings: ledger.Readings = ledger.no_readings,
) -> SyncReply | Failure:
    """Answer one sync. ``readings``: the latest GPU telemetry, for the energy of jobs
    that ended. A sync that changes something durable (a registration, a job
    observation, log bytes, a new address or GPU set) goes through the group-commit
    ``writer``: many agents' writes share one transaction (on SQLite one write lock and
    one fsync per batch instead of per agent), and the reply leaves only after the
    commit."""
    if actor.node is not None and actor.node != name:
        return forbidden(f"this node credential belongs to node {actor.node}, not {name}")
    if body.telemetry is not None:
        readings_now = [t for t in body.telemetry if 0 <= t.index <= MAX_GPU_INDEX]
        hot.telemetry.put(
            name,
            at=now,
            gpus=readings_now,
            driver_version=body.driver_version,
            cuda_version=body.cuda_version,
        )
        hot.health.observe(name, readings_now, now)  # a fired rule wakes the lifecycle loop
    fast = _fast_reply(db, name, body)
    if fast is not None:
        hot.heartbeats.note(name, now)
        hot.heartbeats.maybe_flush(writer, write_heartbeats)
        _count(hot, name, fast.rejected)
        return fast.reply
    write = partial(_write, name=name, body=body, actor=actor.name, now=now, readings=readings)
    for _ in range(5):
        try:
            out = writer.run(write)
        except (Conflict, OperationalError):  # a lost CAS, or the commit failed (SQLite busy too long)
            continue
        if isinstance(out, Failure):
            return out
        if out.reshaped:
            fleets_invalidate()
        if out.changed or out.reshaped or out.first_seen:
            waker()
        _count(hot, name, out.rejected)
        return out.reply
    return conflict(f"node {name}: the database is busy or its jobs change too fast; sync again")


def _count(hot: AgentState, node: str, rejected: Counter[tuple[str, str]]) -> None:
    """Count what a sync had dropped (once, after it was answered: not per retry)."""
    if rejected:
        hot.rejected.add(rejected)
        log.debug("sync of node %s: dropped %s", node, dict(rejected))
