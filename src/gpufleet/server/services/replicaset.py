"""The replica controller's writes: observe each service's replicas, let
``replicas.decide`` choose, apply its actions (one transaction per service, so one bad
service never stops the others), and delete a deleted service once no replica is left.

A replica is a job (``kind='service'``): no time limit, requeued when its node is lost,
never preempted (``loops/snapshot._request``), spread apart from its siblings by the
core, charged and counted against the team's quota like any job. One that exits is
replaced by a new job in the same slot; after exits of that slot in quick succession the
new one waits (``not_before``: the first restart at once, then 5 s doubling to 5 min:
Kubernetes' CrashLoopBackOff, per slot as Kubernetes backs off per container), with the
reason and the last exit in its ``wait_reason`` (``rollouts.crash_backoff``). A rollout
that is not complete past its progress deadline, or whose replicas crash-loop, is marked
by one ``stalled`` event per generation (``replicas.rollout_status``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from gpufleet.api.services import ServiceSpec
from gpufleet.migindex import SHARE_UNITS, share_gpu_type
from gpufleet.server.decide.replicas import Create, Demote, Drain, Promote, Replica, Stop, Wish, decide
from gpufleet.server.errors import Conflict
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import event_row, move, ref, release_attempt
from gpufleet.server.services import rollouts
from gpufleet.server.services.autoscaling import Autoscaler
from gpufleet.server.services.inference import LIVE, add_event, desired_replicas
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.leader import EPOCH
from gpufleet.server.store.models import Allocation, Job, JobEvent, NodeRow, ServiceRow

log = logging.getLogger("gpufleet.server")
ACTOR = "replicaset"
SERVICE_ENV = ("GPUFLEET_SERVICE", "GPUFLEET_REPLICA", "GPUFLEET_HEALTH_PATH", "GPUFLEET_SERVICE_PORT")
"""What the replica controller sets in a replica's environment (the agent reads the last
two: where to probe, and the container's port)."""


def replica_env(spec: ServiceSpec, slot: int) -> dict[str, str]:
    env = dict(spec.env)
    if spec.model_version is not None:
        env["GPUFLEET_MODEL_VERSION"] = spec.model_version
    env.update(
        {
            "GPUFLEET_SERVICE": spec.name,
            "GPUFLEET_REPLICA": str(slot),
            "GPUFLEET_HEALTH_PATH": spec.probe_path,
            "GPUFLEET_SERVICE_PORT": str(spec.port or 8000),
        }
    )
    return env


def share_of(spec: ServiceSpec) -> dict[str, Any]:
    """A replica on part of a shared GPU (``gpu_fraction``): its units, on one node
    (``migindex``, as ``gpufleet submit --gpu-fraction``); {} otherwise."""
    if spec.gpu_fraction is None:
        return {}
    units = max(1, math.ceil(spec.gpu_fraction * SHARE_UNITS))
    return {"gpus": units, "gpus_per_node": units, "nodes": 1, "gpu_type": share_gpu_type(spec.gpu_type)}


def _create(
    s: Session, row: ServiceRow, spec: ServiceSpec, slot: int, *, now: float, reason: str, warm: bool = False
) -> int:
    not_before, waiting = rollouts.crash_backoff(s, row, slot, now)
    values: dict[str, Any] = {
        "name": f"{spec.name}-{slot}",
        "user_id": row.owner_id,
        "team_id": row.team_id,
        "pool": spec.pool,
        "gpus": spec.gpus_per_replica,
        "gpus_per_node": 0,
        "nodes": 0,
        "gpu_type": spec.gpu_type,
        "cuda": spec.cuda,  # where it may run: scheduler/cuda.py
        **share_of(spec),
        "priority": spec.priority,
        "time_limit_s": None,
        "command": list(spec.command or []),
        "env": replica_env(spec, slot),
        "image": spec.image,
        "requeue": True,
        "max_attempts": 1000,
        "attempts": 0,
        "requeue_backoff_s": 5.0,
        "not_before": not_before,
        "wait_reason": waiting,
        "state": str(JobState.PENDING),
        "version": 0,
        "submit_time": now,
        "pending_since": now,
        "attained_service_s": 0.0,
        "executed_s": 0.0,
        "kind": "service",
        "service_id": row.id,
        "replica": slot,
        "generation": row.generation,
        "warm": warm,
    }
    job_id = int(s.execute(insert(Job).values(**values).returning(Job.id)).scalar_one())
    s.execute(
        insert(JobEvent),
        [
            event_row(
                job_id=job_id,
                at=now,
                actor=ACTOR,
                src=None,
                dst=JobState.PENDING,
                reason=f"replica {slot} of service {spec.name} (generation {row.generation}): {reason}",
            )
            | {"epoch": s.info.get(EPOCH)}
        ],
    )
    add_event(
        s,
        row.id,
        at=now,
        actor=ACTOR,
        kind="replica",
        reason=f"job {job_id} created for slot {slot}: {reason}",
    )
    return job_id


def _stop(s: Session, job: Job, *, now: float, reason: str, failed: bool) -> None:
    to = JobState.FAILED if failed and job.state == JobState.RUNNING else JobState.CANCELLED
    values = release_attempt(s, job, now=now, confirmed=False) | {"ended_at": now}
    move(s, ref(job), to, actor=ACTOR, reason=reason, now=now, values=values)


def step_service(s: Session, row: ServiceRow, *, now: float, drain_s: float) -> bool:
    """One service, in the caller's transaction; True if it changed something."""
    spec = ServiceSpec.model_validate(row.spec)
    jobs = {
        j.id: j
        for j in s.scalars(
            select(Job)
            .where(Job.service_id == row.id, Job.state.in_([str(x) for x in LIVE]))
            .order_by(Job.id)
        )
    }
    deleting = row.state == "deleting"
    if deleting and not jobs:
        s.delete(row)
        return True
    wish = Wish(
        replicas=desired_replicas(row, spec),
        warm=spec.warm,
        generation=row.generation,
        readiness_timeout_s=spec.readiness_timeout,
        drain_s=drain_s,
        deleting=deleting,
        max_surge=spec.max_surge,
        max_unavailable=spec.max_unavailable,
        progress_deadline_s=spec.progress_deadline,
    )
    evicted = _on_draining_nodes(s, list(jobs))
    seen = [
        Replica(
            job_id=j.id,
            slot=j.replica or 0,
            generation=j.generation or 0,
            running=j.state == JobState.RUNNING,
            ready=j.ready,
            started_at=j.started_at,
            draining_at=j.draining_at,
            pending_since=None if j.state == JobState.RUNNING else j.pending_since,
            warm=j.warm,
            evicted=j.id in evicted,
        )
        for j in jobs.values()
    ]
    actions = decide(wish, seen, now)
    for a in actions:
        if isinstance(a, Create):
            _create(s, row, spec, a.slot, now=now, reason=a.reason, warm=a.warm)
        elif isinstance(a, Promote | Demote):
            s.execute(update(Job).where(Job.id == a.job_id).values(warm=isinstance(a, Demote)))
            kind = "promote" if isinstance(a, Promote) else "demote"
            add_event(s, row.id, at=now, actor=ACTOR, kind=kind, reason=f"job {a.job_id}: {a.reason}")
        elif isinstance(a, Drain):
            s.execute(update(Job).where(Job.id == a.job_id).values(draining_at=now))
            add_event(s, row.id, at=now, actor=ACTOR, kind="drain", reason=f"job {a.job_id}: {a.reason}")
        elif isinstance(a, Stop):
            _stop(s, jobs[a.job_id], now=now, reason=a.reason, failed=a.failed)
            add_event(s, row.id, at=now, actor=ACTOR, kind="stop", reason=f"job {a.job_id}: {a.reason}")
    if not deleting:
        _note_stall(s, row, wish, seen, now=now)
    return bool(actions)


def _on_draining_nodes(s: Session, job_ids: list[int]) -> set[int]:
    """The replicas that hold GPUs on a draining node (a drain, a driver upgrade): the
    controller moves them elsewhere, surge first (``decide/replicas.py``, rule 5)."""
    if not job_ids:
        return set()
    q = (
        select(Allocation.job_id)
        .join(NodeRow, NodeRow.name == Allocation.node)
        .where(Allocation.job_id.in_(job_ids), NodeRow.drain_deadline.is_not(None))
    )
    return set(s.scalars(q))


def _note_stall(s: Session, row: ServiceRow, wish: Wish, seen: list[Replica], *, now: float) -> None:
    """One ``stalled`` event per generation, the first time its rollout is stalled."""
    why = rollouts.note_stall(s, row, wish, seen, now=now)
    if why is not None:
        add_event(s, row.id, at=now, actor=ACTOR, kind="stalled", reason=why)
        log.warning("service %s: rollout stalled: %s", row.name, why)


def reconcile(*, db: Database, now: float, drain_s: float, autoscaler: Autoscaler | None = None) -> int:
    """Every service once (autoscaled ones first step their count); returns how many
    changed. A service whose step fails (a lost CAS, a bad row) is logged and retried on
    the next step."""
    with db.read() as s:
        ids = list(s.scalars(select(ServiceRow.id).order_by(ServiceRow.id)))
    if autoscaler is not None:
        autoscaler.forget(set(ids))
    changed = 0
    for sid in ids:
        try:
            with db.write() as s:
                row = s.get(ServiceRow, sid)
                if row is None:
                    continue
                scaled = False
                if autoscaler is not None and row.state == "active":
                    spec = ServiceSpec.model_validate(row.spec)
                    if spec.autoscaled:
                        scaled = autoscaler.step(s, row, spec, now)
                if step_service(s, row, now=now, drain_s=drain_s) or scaled:
                    changed += 1
                    effects.wake_scheduler(s)  # new replicas are placed at once
        except Conflict:
            continue  # a job moved meanwhile: next step sees it
        except Exception:
            log.exception("replica controller: service %s", sid)
    return changed
