"""A batch of submissions in the group-commit queue: each one as a ``NewJob`` (validated
so far), and what the batch looks up once in its transaction (``Lookups``: pools,
memberships, QOS, licenses, and the fleets loaded as they are needed), one query each per
batch, not per job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from gpufleet.api.jobs import JobSubmit
from gpufleet.arrayspec import ArraySpec
from gpufleet.scheduler import Fleet
from gpufleet.scheduler.deps import Dependency
from gpufleet.server.problems import Failure
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.caps import PendingCounts
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.services.submitopts import BatchOptions
from gpufleet.server.store.models import DEFAULT_POOL, Job

# The batch's lookups, built once (Core, not ORM: submitting is the API's hottest path).
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
class Lookups:
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


def look_up(s: Session, batch: Sequence[NewJob]) -> Lookups:
    """The pools, the memberships of the batch's submitters, the QOS, and the licenses
    when a job of the batch names one: one query each."""
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
    return Lookups(
        s=s,
        pools=pools,
        teams=teams,
        defaults=defaults,
        default_pool=default_pool,
        qos=qos,
        licenses=licenses,
    )
