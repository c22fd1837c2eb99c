"""The server half of the agent protocol (README, "Server and agents"): ``POST /v1/nodes/{name}/sync``.

An agent sends what it observes (inventory, telemetry, the state of each job attempt it
holds, new log bytes); the answer is the set of job attempts the node should run, plus
how much of each log the server has. It is idempotent: replaying a message, losing an
answer or restarting either side leaves the same state and gives the same answer.

What a node may speak for (Kubernetes' NodeRestriction: a kubelet may change only its
own Node and the status of the pods bound to it). A sync's job state and log bytes
count only for a job *attempt* (``DesiredJob.attempt``):

- placed on this node (it holds GPUs here) at exactly that attempt, or
- that this node was told to stop (``Job.stopping_on``, attempt ``stopping_attempt``)
  and has not confirmed yet: it still ships that attempt's last output;
- log bytes only: the job's latest attempt, over, whose log this node holds open
  (``services/logs.py``: the agent reports an exit at once and ships the rest after).

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

A sync that closes the log of a FAILED job's attempt (its chunk marked ``last``) queues
that attempt's output for the diagnosis loop (``services/diagnoses.py``, issue 34): the
matching never runs in the sync.

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

A reply that asks nothing of the node (no job, MIG change, upgrade order or
acknowledgement) to a sync that reported no XID event carries a lease
(``agentstate.Leases``, issue 35): while the agent has nothing new to say it renews it
(``services/renew.py``) instead of syncing in full.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from sqlalchemy import bindparam, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpufleet.api.base import MAX_GPU_INDEX
from gpufleet.api.nodes import GpuIn, NodeSync, SyncReply
from gpufleet.server.errors import Conflict
from gpufleet.server.problems import Failure, conflict, forbidden, not_found
from gpufleet.server.services import miglayouts, preflight, racks, upgrades
from gpufleet.server.services.diagnoses import queue_closed
from gpufleet.server.services.logs import LOG_MAX_BYTES, ingest_logs
from gpufleet.server.services.nodes import inventory_problem, set_gpus, write_heartbeats
from gpufleet.server.services.nodework import desired, observe, quarantine, scope_of, would_change
from gpufleet.server.services.steps import ingest_tasks
from gpufleet.server.store import effects, ledger
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import DEFAULT_POOL, Allocation, GpuRow, Job, NodeRow
from gpufleet.server.store.writer import Writer

log = logging.getLogger("gpufleet.server")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentActor:
    """Who syncs: ``node`` is the one node a node credential speaks for (None: an
    operator or admin token, which may speak for any node)."""

    name: str
    node: str | None
    credential_id: int | None = None
    """The join token it authenticated with, if that is how (recorded with a certificate)."""


# -- the endpoint ----------------------------------------------------------------------------------


_STORED_GPUS = (
    select(
        GpuRow.index,
        GpuRow.uuid,
        GpuRow.model,
        GpuRow.memory_mb,
        GpuRow.nvlink_domain,
        GpuRow.healthy,
        GpuRow.mig_enabled,
        GpuRow.mig_instances,
    )
    .where(GpuRow.node == bindparam("node"))
    .order_by(GpuRow.index)
)
_NODE = select(
    NodeRow.last_seen,
    NodeRow.leaf,
    NodeRow.rack,
    NodeRow.address,
    NodeRow.cpus,
    NodeRow.memory_mb,
    NodeRow.warning,
    NodeRow.features,
    NodeRow.cuda_version,
).where(NodeRow.name == bindparam("node"))


_JOB_HERE = select(Allocation.id).where(Allocation.node == bindparam("node")).limit(1)
"""Allocations exist only for SCHEDULED/RUNNING jobs (``release_attempt`` deletes them)."""
_STOPPING = (
    select(Job.id).where(Job.stopping_on.is_not(None), Job.stopping_on.like(bindparam("like"))).limit(1)
)


def _same_gpus(s: Session, node: str, gpus: Sequence[GpuIn]) -> bool:
    stored = [(*r[:6], r[6], list(r[7] or ())) for r in s.connection().execute(_STORED_GPUS, {"node": node})]
    sent = sorted(
        (g.index, g.uuid, g.model, g.memory_mb, g.nvlink_domain, g.healthy, g.mig_enabled, _mig(g))
        for g in gpus
    )
    return stored == sent


def _mig(g: GpuIn) -> list[dict[str, Any]]:
    return [m.model_dump() for m in g.mig_instances]


class _Placed(Protocol):
    """Where a node is (a NodeRow, or a row of ``_NODE``)."""

    @property
    def leaf(self) -> str | None: ...
    @property
    def rack(self) -> str | None: ...
    @property
    def address(self) -> str | None: ...
    @property
    def cpus(self) -> int: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def features(self) -> list[str]: ...
    @property
    def warning(self) -> str | None: ...
    @property
    def cuda_version(self) -> str | None: ...


def _node_differs(n: _Placed, body: NodeSync) -> bool:
    if (body.warning or None) != n.warning:  # None clears it: the agent no longer says it
        return True
    if body.features is not None and sorted(set(body.features)) != list(n.features or ()):
        return True
    return any(
        new is not None and new != old
        for new, old in (
            (body.leaf, n.leaf),
            (body.rack, n.rack),
            (body.address, n.address),
            (body.cpus, n.cpus),
            (body.memory_mb, n.memory_mb),
            (body.cuda_version, n.cuda_version),  # where jobs that need CUDA may go
        )
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Answer:
    reply: SyncReply
    rejected: Counter[tuple[str, str]]


def _fast_reply(db: Database, name: str, body: NodeSync) -> _Answer | None:
    """The answer when this sync changes nothing durable, else None. Most syncs of a
    fleet end here (a heartbeat and telemetry): plain Core statements, no ORM objects
    unless the node reports jobs."""
    if body.logs or body.mig_results or body.steps or body.preflight or body.upgrade:
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
        scope = scope_of(s, name, body)
        if (busy or stopping) and would_change(s, name, body, scope):
            return None
        jobs = desired(s, name) if busy else []
        return _Answer(
            reply=SyncReply(
                node=name, jobs=jobs, mig=miglayouts.changes(s, name), upgrade=upgrades.order_for(s, name)
            ),
            rejected=scope.rejected,
        )


def _write(
    s: Session,
    *,
    name: str,
    body: NodeSync,
    actor: str,
    now: float,
    readings: ledger.Readings,
    log_max_bytes: int = LOG_MAX_BYTES,
) -> _Answer | Failure:
    """The durable half of a sync, in the caller's transaction (the group commit's
    SAVEPOINT): register or update the node (an inventory it cannot take cordons it
    instead), apply the observations, ingest the logs. Raises ``Conflict`` on a
    lost compare-and-set. Once committed, a node of a new shape drops the fleet
    caches, and one that changed something (or is new) wakes the scheduler
    (``effects.py``)."""
    node = s.get(NodeRow, name)
    if node is None:
        if body.gpus is None:
            return not_found(f"no node {name}: register it or send its gpus")
        node = NodeRow(name=name, created_at=now, pool=DEFAULT_POOL)
        s.add(node)
    scope = scope_of(s, name, body)  # before anything of this sync is applied
    was_seen_at = node.last_seen
    new_gpus = body.gpus is not None and not _same_gpus(s, name, body.gpus)
    reshaped = _node_differs(node, body) or new_gpus
    node.last_seen = now
    node.leaf = body.leaf or node.leaf or "leaf-0"
    node.rack = body.rack or node.rack or "rack-0"
    node.address = body.address or node.address
    if body.cpus is not None:  # what the scheduler may hand out besides GPUs (``resources.py``)
        node.cpus = body.cpus
    if body.memory_mb is not None:
        node.memory_mb = body.memory_mb
    if body.features is not None:  # ``--constraint`` matches them (``scheduler/features.py``)
        node.features = sorted(set(body.features))
    node.warning = body.warning or None
    if body.cuda_version is not None:  # ``scheduler/cuda.py`` places jobs that need one by it
        node.cuda_version = body.cuda_version
    if body.preflight is not None and preflight.record(s, node, body.preflight, now):
        reshaped = True  # cordoned: the fleet caches see it
    s.flush()
    if body.gpus is not None and new_gpus:
        bad = inventory_problem(s, name, body.gpus)
        if bad is None:
            set_gpus(s, name, body.gpus)
        elif not quarantine(s, node, bad.reason, now):
            reshaped = _node_differs(node, body)  # the same refusal again: nothing new
        s.flush()
    changed = observe(s, name, body, scope, actor, now, readings)
    acks = ingest_logs(s, name, scope.logs, now, max_bytes=log_max_bytes)
    queue_closed(s, name, scope.logs, now)  # failed attempts' output to diagnose (issue 34)
    step_acks = ingest_tasks(s, name, body.steps, now)  # srun's tasks (``services/steps.py``)
    if body.mig_results and miglayouts.record(s, name, body.mig_results, actor=actor, now=now):
        reshaped = True
    if body.upgrade is not None and upgrades.record_report(s, name, body.upgrade, now=now):
        reshaped = True  # a driver upgrade judged (``services/upgrades.py``)
    s.flush()
    if reshaped:
        effects.invalidate_fleets(s)
    if changed or reshaped or was_seen_at is None:
        effects.wake_scheduler(s)
    return _Answer(
        reply=SyncReply(
            node=name,
            jobs=desired(s, name),
            log_acks=acks,
            mig=miglayouts.changes(s, name),
            step_acks=step_acks,
            upgrade=upgrades.order_for(s, name),
        ),
        rejected=scope.rejected,
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
    readings: ledger.Readings = ledger.no_readings,
    log_max_bytes: int = LOG_MAX_BYTES,
    version: str | None = None,
) -> SyncReply | Failure:
    """Answer one sync. ``readings``: the latest GPU telemetry, for the energy of jobs
    that ended; ``log_max_bytes``: what is kept of a job attempt's log from one node
    (``ServerConfig.job_log_max_bytes``). A sync that changes something durable (a registration, a job
    observation, log bytes, a new address or GPU set) goes through the group-commit
    ``writer``: many agents' writes share one transaction (on SQLite one write lock and
    one fsync per batch instead of per agent), and the reply leaves only after the
    commit. ``version``: the node's dispatch version read before this sync (None: no
    lease is granted)."""
    if actor.node is not None and actor.node != name:
        return forbidden(f"this node credential belongs to node {actor.node}, not {name}")
    if body.telemetry is not None:
        readings_now = [t for t in body.telemetry if 0 <= t.index <= MAX_GPU_INDEX]
        hot.telemetry_seen(
            name, at=now, gpus=readings_now, driver=body.driver_version, cuda=body.cuda_version
        )
        if hot.relay is not None:  # several servers: the leader's health rules see it too
            hot.relay.telemetry(name, now, readings_now, body.driver_version, body.cuda_version)
        if hot.power.note(name, at=now, gpus=readings_now):  # for the scheduling pass's rack power
            hot.power.maybe_flush(writer, racks.write_gpu_power)
    fast = _fast_reply(db, name, body)
    if fast is not None:
        hot.heartbeats.note(name, now)
        hot.heartbeats.maybe_flush(writer, write_heartbeats)
        hot.power.maybe_flush(writer, racks.write_gpu_power)  # readings noted earlier, if due
        _count(hot, name, fast.rejected)
        return _leased(hot, name, body, fast.reply, version, now)
    write = partial(
        _write,
        name=name,
        body=body,
        actor=actor.name,
        now=now,
        readings=readings,
        log_max_bytes=log_max_bytes,
    )
    for _ in range(5):
        try:
            out = writer.run(write)
        except (Conflict, OperationalError):  # a lost CAS, or the commit failed (SQLite busy too long)
            continue
        if isinstance(out, Failure):
            return out
        _count(hot, name, out.rejected)
        return _leased(hot, name, body, out.reply, version, now)
    return conflict(f"node {name}: the database is busy or its jobs change too fast; sync again")


def _leased(
    hot: AgentState, name: str, body: NodeSync, reply: SyncReply, version: str | None, now: float
) -> SyncReply:
    """``reply`` with a lease where it asks nothing of the node (``agentstate.Leases``).
    Not after XID events: a renewal re-counts the telemetry the server holds."""
    xids = any(t.xid_events for t in body.telemetry or ())
    asks = reply.jobs or reply.log_acks or reply.mig or reply.step_acks or reply.upgrade is not None
    if version is None or asks or xids:
        hot.leases.revoke(name)
        return reply
    return reply.model_copy(update={"lease": hot.leases.grant(name, version=version, at=now)})


def _count(hot: AgentState, node: str, rejected: Counter[tuple[str, str]]) -> None:
    """Count what a sync had dropped (once, after it was answered: not per retry)."""
    if rejected:
        hot.rejected.add(rejected)
        log.debug("sync of node %s: dropped %s", node, dict(rejected))
