"""Inference services: deploy (create or replace, like ``kubectl apply``), update,
delete, list, show, gateway tokens, and the endpoint feed the gateways poll.

Gateway tokens are in ``servicetokens.py``, the gateways' feed in ``gatewayfeed.py``.

Visibility: a service is its owner's; operators and admins see and act on every one.
Anyone else gets 404 (it is not revealed that the name exists). The replicas are jobs
(``Job.kind == 'service'``); the replica controller (``replicaset.py``, run by
``loops/replicas.py``) creates, drains and stops them to match the spec.

What rolls the replicas (a new spec generation): a change of what they run (command,
image, port, env, model version, health path, protocol, GPUs, GPU type, pool). A change
of ``replicas`` or of the bounds only adds or drains replicas; priority and the
readiness timeout apply to replicas created from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.api.services import (
    ReplicaOut,
    RolloutOut,
    ServiceEventOut,
    ServiceOut,
    ServicePatch,
    ServiceSpec,
    ServiceTraffic,
)
from gpufleet.server.decide.replicas import Replica, Wish
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services import rollouts
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.modelwishes import summarize
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import (
    Allocation,
    Job,
    Membership,
    Pool,
    ServiceEvent,
    ServiceRow,
    ServiceSpecRow,
    ServiceToken,
    Team,
    User,
)

LIVE = (JobState.PENDING, JobState.HELD, JobState.SCHEDULED, JobState.RUNNING)
IN_ROTATION = (
    Job.kind == "service",
    Job.state == str(JobState.RUNNING),
    Job.ready.is_(True),
    Job.draining_at.is_(None),
    Job.warm.is_(False),
)
"""Replicas the gateways send requests to: running, ready, not draining, not warm."""
ROLLING = (
    "command",
    "image",
    "port",
    "env",
    "model_version",
    "health_path",
    "protocol",
    "gpus_per_replica",
    "gpu_type",
    "gpu_fraction",
    "cuda",
    "pool",
)


def _count(n: int) -> str:
    """``1 replica``, ``3 replicas`` (as ``replicas._replicas``; the CLI's ``words.count``)."""
    return f"{n} replica{'' if n == 1 else 's'}"


def add_event(s: Session, service_id: int, *, at: float, actor: str, kind: str, reason: str) -> None:
    s.add(ServiceEvent(service_id=service_id, at=at, actor=actor[:140], kind=kind, reason=reason[:512]))


# -- who may do what ------------------------------------------------------------------------------


def load_service(s: Session, actor: Principal, name: str) -> ServiceRow | Failure:
    """The service ``name`` if ``actor`` may see it (its owner, an operator), else 404."""
    row = s.scalar(select(ServiceRow).where(ServiceRow.name == name))
    if row is None or (row.owner_id != actor.user_id and not actor.is_operator):
        return not_found(f"no service {name}")
    return row


def load_active(s: Session, actor: Principal, name: str) -> ServiceRow | Failure:
    """``load_service``, and 409 while the service is being deleted (what changes it)."""
    row = load_service(s, actor, name)
    if not isinstance(row, Failure) and row.state == "deleting":
        return conflict(f"service {name} is being deleted")
    return row


def _team_for(s: Session, actor: Principal, team: str | None) -> int | Failure:
    """Slurm's rule, as for a job: the named team (a member's, or any for an admin),
    else the user's default team, else their only one."""
    mine = {
        name: (tid, default)
        for name, tid, default in s.execute(
            select(Team.name, Team.id, Membership.is_default)
            .join(Membership, Membership.team_id == Team.id)
            .where(Membership.user_id == actor.user_id)
        )
    }
    if team is not None:
        if team in mine:
            return mine[team][0]
        if actor.is_admin:
            tid = s.scalar(select(Team.id).where(Team.name == team))
            return invalid(f"team: no team {team}") if tid is None else tid
        return forbidden(f"you are not a member of team {team}")
    defaults = [tid for tid, default in mine.values() if default]
    if defaults:
        return defaults[0]
    if len(mine) == 1:
        return next(iter(mine.values()))[0]
    if not mine:
        return invalid("team: you belong to no team; an admin adds you to one (gpufleet admin add-member)")
    return invalid(f"team: you belong to teams {', '.join(sorted(mine))}: name one (team: in the spec)")


def desired_replicas(row: ServiceRow, spec: ServiceSpec) -> int:
    """The serving count the controller works toward: the autoscaler's, within the
    spec's bounds, when the service is autoscaled; else ``spec.replicas``."""
    if not spec.autoscaled or row.scaled_replicas is None:
        return spec.replicas
    lo = spec.min_replicas if spec.min_replicas is not None else spec.replicas
    hi = spec.max_replicas if spec.max_replicas is not None else spec.replicas
    return max(lo, min(hi, row.scaled_replicas))


# -- showing -------------------------------------------------------------------------------------


def _previous(s: Session, row: ServiceRow) -> dict[int, int]:
    """Per slot, the newest job of this service that no longer runs (``kubectl logs -p``)."""
    q = (
        select(Job.replica, func.max(Job.id))
        .where(
            Job.service_id == row.id,
            Job.state.not_in([str(x) for x in LIVE]),
            Job.submit_time >= row.created_at,
        )
        .group_by(Job.replica)
    )
    return {slot or 0: jid for slot, jid in s.execute(q)}


def _replicas(s: Session, service_id: int, previous: dict[int, int] | None = None) -> list[ReplicaOut]:
    previous = previous or {}
    jobs = s.scalars(
        select(Job)
        .where(Job.service_id == service_id, Job.state.in_([str(x) for x in LIVE]))
        .order_by(Job.id)
    ).all()
    placed: dict[int, dict[str, list[int]]] = {}
    if jobs:
        q = select(Allocation.job_id, Allocation.node, Allocation.gpu_index).where(
            Allocation.job_id.in_([j.id for j in jobs])
        )
        for jid, node, idx in s.execute(q):
            gpus = placed.setdefault(jid, {}).setdefault(node, [])
            if idx is not None:
                gpus.append(idx)
    return [
        ReplicaOut(
            job_id=j.id,
            replica=j.replica or 0,
            generation=j.generation or 0,
            state=j.state,
            ready=j.ready,
            draining=j.draining_at is not None,
            warm=j.warm,
            endpoint=j.endpoint,
            nodes=sorted(placed.get(j.id, {})),
            gpus=sorted(g for gs in placed.get(j.id, {}).values() for g in gs),
            started_at=j.started_at,
            ready_at=j.ready_at,
            reason=j.wait_reason if j.state == JobState.PENDING else None,
            previous_job_id=previous.get(j.replica or 0),
        )
        for j in jobs
    ]


def _out(
    s: Session, row: ServiceRow, *, events: int = 20, traffic: ServiceTraffic | None = None
) -> ServiceOut:
    owner = s.scalar(select(User.name).where(User.id == row.owner_id)) or "?"
    team = s.scalar(select(Team.name).where(Team.id == row.team_id)) or "?"
    reps = _replicas(s, row.id, _previous(s, row) if events else None)
    evs = s.scalars(
        select(ServiceEvent)
        .where(ServiceEvent.service_id == row.id)
        .order_by(ServiceEvent.id.desc())
        .limit(events)
    ).all()
    spec = ServiceSpec.model_validate(row.spec)
    rollout = None if row.state == "deleting" else _rollout(s, row, spec, reps)
    return ServiceOut(
        name=row.name,
        owner=owner,
        team=team,
        state="deleting" if row.state == "deleting" else "active",
        generation=row.generation,
        spec=spec,
        replicas_desired=0 if row.state == "deleting" else desired_replicas(row, spec),
        replicas_ready=sum(1 for r in reps if r.ready and not r.draining and not r.warm),
        replicas_warm=sum(1 for r in reps if r.warm and not r.draining),
        traffic=traffic,
        rollout=rollout,
        replicas=reps,
        models=summarize(s, row),
        events=[ServiceEventOut(at=e.at, actor=e.actor, kind=e.kind, reason=e.reason) for e in reversed(evs)],
        created_at=row.created_at,
        updated_at=row.updated_at,
        url_path=f"/s/{row.name}/",
    )


def _rollout(s: Session, row: ServiceRow, spec: ServiceSpec, reps: list[ReplicaOut]) -> RolloutOut:
    wish = Wish(
        replicas=desired_replicas(row, spec),
        generation=row.generation,
        readiness_timeout_s=spec.readiness_timeout,
        drain_s=0.0,
        warm=spec.warm,
    )
    seen = [
        Replica(
            job_id=r.job_id,
            slot=r.replica,
            generation=r.generation,
            running=r.state == JobState.RUNNING,
            ready=r.ready,
            started_at=r.started_at,
            draining_at=0.0 if r.draining else None,
            warm=r.warm,
        )
        for r in reps
    ]
    verdict = rollouts.shown(s, row, wish, seen)
    return RolloutOut(state=verdict.state, generation=verdict.generation, reason=verdict.reason)  # type: ignore[arg-type]


Traffic = Callable[[str], ServiceTraffic | None]
"""A service's traffic as the gateways report it (``TrafficStore.stats`` at now)."""


def no_traffic(name: str) -> None:
    return None


def show(*, db: Database, actor: Principal, name: str, traffic: Traffic = no_traffic) -> ServiceOut | Failure:
    with db.read() as s:
        row = load_service(s, actor, name)
        return row if isinstance(row, Failure) else _out(s, row, traffic=traffic(row.name))


def events(*, db: Database, actor: Principal, name: str, limit: int) -> list[ServiceEventOut] | Failure:
    """The newest ``limit`` events of a service, oldest first (deploys, updates,
    replicas made and stopped, every scaling decision with its inputs)."""
    with db.read() as s:
        row = load_service(s, actor, name)
        if isinstance(row, Failure):
            return row
        q = (
            select(ServiceEvent)
            .where(ServiceEvent.service_id == row.id)
            .order_by(ServiceEvent.id.desc())
            .limit(limit)
        )
        rows = list(s.scalars(q))
    return [ServiceEventOut(at=e.at, actor=e.actor, kind=e.kind, reason=e.reason) for e in reversed(rows)]


def list_services(*, db: Database, actor: Principal, traffic: Traffic = no_traffic) -> list[ServiceOut]:
    with db.read() as s:
        q = select(ServiceRow).order_by(ServiceRow.name)
        if not actor.is_operator:
            q = q.where(ServiceRow.owner_id == actor.user_id)
        return [_out(s, row, events=0, traffic=traffic(row.name)) for row in s.scalars(q)]


# -- changing ------------------------------------------------------------------------------------


def _pool_problem(s: Session, spec: ServiceSpec) -> Failure | None:

    gpu = s.scalar(select(Pool.gpu).where(Pool.name == spec.pool))
    if gpu is None:
        return invalid(f"pool: no pool {spec.pool}")
    if gpu and spec.gpus_per_replica == 0:
        return invalid(
            f"pool {spec.pool} has GPUs: gpus_per_replica must be at least 1 (or use a CPU-only pool)"
        )
    if not gpu and spec.gpus_per_replica:
        return invalid(f"pool {spec.pool} is CPU-only: gpus_per_replica must be 0")
    if spec.gpu_fraction is not None and spec.gpus_per_replica != 1:
        return invalid("gpu_fraction: a replica's share is part of one GPU (gpus_per_replica 1)")
    return None


def _rolls(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [k for k in ROLLING if old.get(k) != new.get(k)]


def deploy(*, db: Database, actor: Principal, spec: ServiceSpec, now: float) -> ServiceOut | Failure:
    """Create the service, or replace the spec of an existing one (its owner, or an
    operator): a new generation when something replicas run changed."""
    with db.write() as s:
        problem = _pool_problem(s, spec)
        if problem is not None:
            return problem
        row = s.scalar(select(ServiceRow).where(ServiceRow.name == spec.name))
        if row is None:
            team = _team_for(s, actor, spec.team)
            if isinstance(team, Failure):
                return team
            row = ServiceRow(
                name=spec.name,
                owner_id=actor.user_id,
                team_id=team,
                spec=spec.model_dump(mode="json"),
                generation=1,
                state="active",
                created_at=now,
                updated_at=now,
                version=0,
            )
            s.add(row)
            s.flush()
            _record(s, row, actor=actor.name, now=now)
            add_event(s, row.id, at=now, actor=actor.name, kind="deployed", reason=_count(spec.replicas))
            out = _out(s, row)
        else:
            if row.owner_id != actor.user_id and not actor.is_operator:
                # Names are one namespace (the gateways' paths, like DNS names): that it is
                # taken is said, not by whom, and nothing of the service is shown.
                return conflict(f"the name {spec.name} is taken; pick another")
            if row.state == "deleting":
                return conflict(f"service {spec.name} is being deleted; deploy it again once it is gone")
            if spec.team is not None:
                team = _team_for(s, actor, spec.team)
                if isinstance(team, Failure):
                    return team
                row.team_id = team
            out = _replace(s, row, spec.model_dump(mode="json"), actor=actor.name, now=now)
        effects.wake_replicas(s)
    return out


def _record(s: Session, row: ServiceRow, *, actor: str, now: float) -> None:
    """The spec of the generation that begins now (``service rollback``)."""
    s.add(
        ServiceSpecRow(service_id=row.id, generation=row.generation, spec=row.spec, at=now, actor=actor[:140])
    )


def _replace(s: Session, row: ServiceRow, new: dict[str, Any], *, actor: str, now: float) -> ServiceOut:
    old = dict(row.spec)
    rolled = _rolls(old, new)
    if rolled:
        row.generation += 1
        add_event(
            s,
            row.id,
            at=now,
            actor=actor,
            kind="updated",
            reason=f"generation {row.generation}: {', '.join(rolled)} changed; rolling replicas one by one",
        )
    if old.get("replicas") != new.get("replicas"):
        add_event(
            s,
            row.id,
            at=now,
            actor=actor,
            kind="scaled",
            reason=f"{old.get('replicas')} -> {_count(new['replicas'])}",
        )
    if old.get("replicas") != new.get("replicas") or (old.get("min_replicas"), old.get("max_replicas")) != (
        new.get("min_replicas"),
        new.get("max_replicas"),
    ):
        row.scaled_replicas = None  # the autoscaler starts again from the new count
    row.spec = new
    row.updated_at = now
    row.version += 1
    if rolled:
        _record(s, row, actor=actor, now=now)
    s.flush()
    return _out(s, row)


def update(
    *, db: Database, actor: Principal, name: str, patch: ServicePatch, now: float
) -> ServiceOut | Failure:
    with db.write() as s:
        row = load_active(s, actor, name)
        if isinstance(row, Failure):
            return row
        merged = dict(row.spec) | patch.model_dump(mode="json", exclude_unset=True)
        try:
            spec = ServiceSpec.model_validate(merged)
        except ValidationError as exc:
            why = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}"
                for e in exc.errors(include_input=False)
            )
            return invalid(f"the updated spec is not valid: {why}")
        problem = _pool_problem(s, spec)
        if problem is not None:
            return problem
        out = _replace(s, row, spec.model_dump(mode="json"), actor=actor.name, now=now)
        effects.wake_replicas(s)
    return out


def rollback(
    *, db: Database, actor: Principal, name: str, generation: int | None, now: float
) -> ServiceOut | Failure:
    """Run an earlier generation's replica template again (``kubectl rollout undo``): the
    fields that roll (``ROLLING``) as they were then, the rest as they are now, as a new
    generation through the same rolling update."""
    with db.write() as s:
        row = load_active(s, actor, name)
        if isinstance(row, Failure):
            return row
        target = generation if generation is not None else row.generation - 1
        if target >= row.generation or target < 1:
            return invalid(
                f"generation: service {name} is at generation {row.generation}; name an earlier one"
            )
        then = s.scalar(
            select(ServiceSpecRow.spec).where(
                ServiceSpecRow.service_id == row.id, ServiceSpecRow.generation == target
            )
        )
        if then is None:
            return conflict(
                f"generation {target} of service {name} was not recorded (deployed before history)"
            )
        new = dict(row.spec) | {k: then.get(k) for k in ROLLING}
        if not _rolls(row.spec, new):
            return conflict(f"service {name} already runs what generation {target} ran")
        add_event(
            s, row.id, at=now, actor=actor.name, kind="rollback", reason=f"to generation {target}'s replicas"
        )
        try:
            spec = ServiceSpec.model_validate(new)
        except ValidationError as exc:
            return invalid(
                f"generation {target}'s replicas do not fit the spec now: {exc.error_count()} errors"
            )
        out = _replace(s, row, spec.model_dump(mode="json"), actor=actor.name, now=now)
        effects.wake_replicas(s)
    return out


def delete(*, db: Database, actor: Principal, name: str, now: float) -> ServiceOut | Failure:
    """Drain and stop every replica and revoke its tokens; the service is gone once no
    replica is left."""
    with db.write() as s:
        row = load_service(s, actor, name)
        if isinstance(row, Failure):
            return row
        if row.state != "deleting":
            row.state = "deleting"
            row.updated_at = now
            row.version += 1
            add_event(s, row.id, at=now, actor=actor.name, kind="deleting", reason="draining its replicas")
            for tok in s.scalars(select(ServiceToken).where(ServiceToken.service_id == row.id)):
                tok.revoked_at = tok.revoked_at or now
        s.flush()
        out = _out(s, row)
        effects.wake_replicas(s)
    return out


__all__ = [
    "ACTIVE",
    "delete",
    "deploy",
    "list_services",
    "show",
    "update",
]
