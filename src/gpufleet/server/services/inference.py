"""Inference services: deploy (create or replace, like ``kubectl apply``), update,
delete, list, show, gateway tokens, and the endpoint feed the gateways poll.

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

import hashlib
import secrets
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.services import (
    GatewayEndpoint,
    GatewayFeed,
    GatewayRate,
    GatewayService,
    ReplicaOut,
    ServiceEventOut,
    ServiceOut,
    ServicePatch,
    ServiceSpec,
    ServiceTokenOut,
    ServiceTraffic,
)
from gpufleet.server.agentstate import TelemetryStore
from gpufleet.server.db import Database
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.models import (
    Allocation,
    Job,
    Membership,
    ServiceEvent,
    ServiceRow,
    ServiceToken,
    Team,
    User,
)
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.ratelimit import Rate
from gpufleet.server.services.auth import Principal

Waker = Callable[[], None]
LIVE = (JobState.PENDING, JobState.HELD, JobState.SCHEDULED, JobState.RUNNING)
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
    "pool",
)
MAX_TOKENS = 16
"""Live gateway tokens per service (rotate by creating one, then revoking the old)."""


def hash_service_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_event(s: Session, service_id: int, *, at: float, actor: str, kind: str, reason: str) -> None:
    s.add(ServiceEvent(service_id=service_id, at=at, actor=actor[:140], kind=kind, reason=reason[:512]))


# -- who may do what ------------------------------------------------------------------------------


def _load(s: Session, actor: Principal, name: str) -> ServiceRow | Failure:
    row = s.scalar(select(ServiceRow).where(ServiceRow.name == name))
    if row is None or (row.owner_id != actor.user_id and not actor.is_operator):
        return not_found(f"no service {name}")
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


def _replicas(s: Session, service_id: int) -> list[ReplicaOut]:
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
        )
        for j in jobs
    ]


def _out(
    s: Session, row: ServiceRow, *, events: int = 20, traffic: ServiceTraffic | None = None
) -> ServiceOut:
    owner = s.scalar(select(User.name).where(User.id == row.owner_id)) or "?"
    team = s.scalar(select(Team.name).where(Team.id == row.team_id)) or "?"
    reps = _replicas(s, row.id)
    evs = s.scalars(
        select(ServiceEvent)
        .where(ServiceEvent.service_id == row.id)
        .order_by(ServiceEvent.id.desc())
        .limit(events)
    ).all()
    spec = ServiceSpec.model_validate(row.spec)
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
        replicas=reps,
        events=[ServiceEventOut(at=e.at, actor=e.actor, kind=e.kind, reason=e.reason) for e in reversed(evs)],
        created_at=row.created_at,
        updated_at=row.updated_at,
        url_path=f"/s/{row.name}/",
    )


Traffic = Callable[[str], ServiceTraffic | None]
"""A service's traffic as the gateways report it (``TrafficStore.stats`` at now)."""


def no_traffic(name: str) -> None:
    return None


def show(*, db: Database, actor: Principal, name: str, traffic: Traffic = no_traffic) -> ServiceOut | Failure:
    with db.read() as s:
        row = _load(s, actor, name)
        return row if isinstance(row, Failure) else _out(s, row, traffic=traffic(row.name))


def events(*, db: Database, actor: Principal, name: str, limit: int) -> list[ServiceEventOut] | Failure:
    """The newest ``limit`` events of a service, oldest first (deploys, updates,
    replicas made and stopped, every scaling decision with its inputs)."""
    with db.read() as s:
        row = _load(s, actor, name)
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
    from gpufleet.server.models import Pool

    gpu = s.scalar(select(Pool.gpu).where(Pool.name == spec.pool))
    if gpu is None:
        return invalid(f"pool: no pool {spec.pool}")
    if gpu and spec.gpus_per_replica == 0:
        return invalid(
            f"pool {spec.pool} has GPUs: gpus_per_replica must be at least 1 (or use a CPU-only pool)"
        )
    if not gpu and spec.gpus_per_replica:
        return invalid(f"pool {spec.pool} is CPU-only: gpus_per_replica must be 0")
    return None


def _rolls(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [k for k in ROLLING if old.get(k) != new.get(k)]


def deploy(
    *, db: Database, actor: Principal, spec: ServiceSpec, now: float, waker: Waker
) -> ServiceOut | Failure:
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
            add_event(
                s, row.id, at=now, actor=actor.name, kind="deployed", reason=f"{spec.replicas} replicas"
            )
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
    waker()
    return out


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
            reason=f"{old.get('replicas')} -> {new['replicas']} replicas",
        )
    if old.get("replicas") != new.get("replicas") or (old.get("min_replicas"), old.get("max_replicas")) != (
        new.get("min_replicas"),
        new.get("max_replicas"),
    ):
        row.scaled_replicas = None  # the autoscaler starts again from the new count
    row.spec = new
    row.updated_at = now
    row.version += 1
    s.flush()
    return _out(s, row)


def update(
    *, db: Database, actor: Principal, name: str, patch: ServicePatch, now: float, waker: Waker
) -> ServiceOut | Failure:
    with db.write() as s:
        row = _load(s, actor, name)
        if isinstance(row, Failure):
            return row
        if row.state == "deleting":
            return conflict(f"service {name} is being deleted")
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
    waker()
    return out


def delete(*, db: Database, actor: Principal, name: str, now: float, waker: Waker) -> ServiceOut | Failure:
    """Drain and stop every replica; the service is gone once none is left."""
    with db.write() as s:
        row = _load(s, actor, name)
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
    waker()
    return out


# -- gateway tokens ------------------------------------------------------------------------------


def _token_out(t: ServiceToken, token: str | None = None) -> ServiceTokenOut:
    return ServiceTokenOut(
        id=t.id,
        hint=t.hint,
        created_at=t.created_at,
        created_by=t.created_by,
        revoked_at=t.revoked_at,
        token=token,
    )


def create_token(*, db: Database, actor: Principal, name: str, now: float) -> ServiceTokenOut | Failure:
    with db.write() as s:
        row = _load(s, actor, name)
        if isinstance(row, Failure):
            return row
        if row.state == "deleting":
            return conflict(f"service {name} is being deleted")
        live = s.scalars(
            select(ServiceToken.id).where(
                ServiceToken.service_id == row.id, ServiceToken.revoked_at.is_(None)
            )
        ).all()
        if len(live) >= MAX_TOKENS:
            return conflict(
                f"service {name} has {len(live)} live tokens (at most {MAX_TOKENS}): revoke one first"
            )
        token = "gfs_" + secrets.token_urlsafe(32)
        t = ServiceToken(
            service_id=row.id,
            token_hash=hash_service_token(token),
            hint=token[:8],
            created_at=now,
            created_by=actor.name[:64],
        )
        s.add(t)
        s.flush()
        add_event(
            s, row.id, at=now, actor=actor.name, kind="token", reason=f"token {t.id} ({t.hint}...) created"
        )
        return _token_out(t, token)


def list_tokens(*, db: Database, actor: Principal, name: str) -> list[ServiceTokenOut] | Failure:
    with db.read() as s:
        row = _load(s, actor, name)
        if isinstance(row, Failure):
            return row
        q = select(ServiceToken).where(ServiceToken.service_id == row.id).order_by(ServiceToken.id)
        return [_token_out(t) for t in s.scalars(q)]


def revoke_token(
    *, db: Database, actor: Principal, name: str, token_id: int, now: float
) -> ServiceTokenOut | Failure:
    with db.write() as s:
        row = _load(s, actor, name)
        if isinstance(row, Failure):
            return row
        t = s.get(ServiceToken, token_id)
        if t is None or t.service_id != row.id:
            return not_found(f"service {name} has no token {token_id}")
        if t.revoked_at is None:
            t.revoked_at = now
            add_event(s, row.id, at=now, actor=actor.name, kind="token", reason=f"token {t.id} revoked")
        return _token_out(t)


# -- the gateways' feed --------------------------------------------------------------------------


def _util(
    telemetry: TelemetryStore, node: str, gpus: list[int], now: float, max_age_s: float
) -> float | None:
    t = telemetry.get(node)
    if t is None or now - t.at > max_age_s or not gpus:
        return None
    vals = [
        g.utilization_pct for i in gpus if (g := t.gpus.get(i)) is not None and g.utilization_pct is not None
    ]
    return round(sum(vals) / len(vals), 1) if vals else None


def _rate(text: object) -> GatewayRate | None:
    """A spec's ``rate_limit`` as the gateways take it (the pattern was checked on the way in)."""
    if not isinstance(text, str):
        return None
    try:
        rate = Rate.parse(text)
    except ValueError:
        return None
    return None if rate is None else GatewayRate(burst=rate.burst, per_s=rate.per_s)


def feed(*, db: Database, telemetry: TelemetryStore, now: float, max_age_s: float = 30.0) -> GatewayFeed:
    """Every active service with its live tokens and its ready, not draining replicas
    (a replica stops receiving traffic as soon as it is drained or not ready)."""
    with db.read() as s:
        rows = s.scalars(
            select(ServiceRow).where(ServiceRow.state == "active").order_by(ServiceRow.name)
        ).all()
        tokens: dict[int, list[str]] = {}
        for sid, digest in s.execute(
            select(ServiceToken.service_id, ServiceToken.token_hash).where(ServiceToken.revoked_at.is_(None))
        ):
            tokens.setdefault(sid, []).append(digest)
        ready = s.execute(
            select(
                Job.id,
                Job.service_id,
                Job.replica,
                Job.generation,
                Job.endpoint,
                Allocation.node,
                Allocation.gpu_index,
            )
            .join(Allocation, Allocation.job_id == Job.id)
            .where(
                Job.kind == "service",
                Job.state == str(JobState.RUNNING),
                Job.ready.is_(True),
                Job.draining_at.is_(None),
                Job.warm.is_(False),
                Job.endpoint.is_not(None),
            )
            .order_by(Job.id)
        ).all()
    per: dict[int | None, dict[int, dict[str, Any]]] = {}
    for jid, service_id, replica, gen, url, node, idx in ready:
        ep = per.setdefault(service_id, {}).setdefault(
            jid,
            {
                "job_id": jid,
                "replica": replica or 0,
                "generation": gen or 0,
                "url": url,
                "node": node,
                "gpus": [],
            },
        )
        if idx is not None:
            ep["gpus"].append(idx)
    services = []
    for row in rows:
        eps = [
            GatewayEndpoint(
                id=f"{e['job_id']}.{e['replica']}",
                job_id=e["job_id"],
                replica=e["replica"],
                url=e["url"],
                node=e["node"],
                generation=e["generation"],
                gpu_util=_util(telemetry, e["node"], e["gpus"], now, max_age_s),
            )
            for e in per.get(row.id, {}).values()
        ]
        services.append(
            GatewayService(
                name=row.name,
                protocol=str(row.spec.get("protocol", "http")),
                tokens=sorted(tokens.get(row.id, [])),
                rate=_rate(row.spec.get("rate_limit")),
                endpoints=eps,
            )
        )
    return GatewayFeed(at=now, services=services)


__all__ = [
    "ACTIVE",
    "create_token",
    "delete",
    "deploy",
    "feed",
    "hash_service_token",
    "list_services",
    "list_tokens",
    "revoke_token",
    "show",
    "update",
]
