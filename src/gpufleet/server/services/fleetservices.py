"""The inference services as the fleet page and ``/metrics`` read them: every service
with its live replicas and their GPUs in two queries (``load_services``, part of the
cached ``FleetView``), the page's JSON (``services_for``), and a short history of each
service's replica counts and QPS (``ServiceHistory``).

The history is a ring per service, sampled when the cached view is rebuilt (a page
poll, a scrape or an alert evaluation) at most every ``ServiceHistory.step_s``: no loop
of its own, so a server that nobody reads keeps none, and a freshly opened page shows
the last hour at once instead of filling a chart from its own polls. Like the
telemetry history it is per server process and lost at a restart.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.base import Reply
from gpufleet.api.jobs import AllocationOut
from gpufleet.api.services import ServiceSpec, ServiceTraffic
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.inference import LIVE, desired_replicas
from gpufleet.server.store.models import Allocation, Job, ServiceRow, Team, User

Traffic = Callable[[str], ServiceTraffic | None]
"""A service's traffic now, as the gateways report it (``TrafficStore.stats``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaInfo:
    """A live replica (a job of kind ``service``: PENDING, HELD, SCHEDULED or RUNNING, as
    ``inference.LIVE``) and where it runs: (node, its GPU indexes there), by node."""

    job_id: int
    replica: int
    generation: int
    state: str
    ready: bool
    draining: bool
    endpoint: str | None
    warm: bool = False
    """a standby replica: ready, not in rotation"""
    priority: int = 0
    """the job's priority (its price multiplier)"""
    placement: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def serving(self) -> bool:
        """In the gateway's rotation: ready, not draining, not a warm standby."""
        return self.ready and not self.draining and not self.warm

    @property
    def gpus(self) -> Iterable[tuple[str, int]]:
        return ((node, i) for node, idx in self.placement for i in idx)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceInfo:
    name: str
    owner_id: int
    """whose it is: who may see it on the page (as ``GET /v1/services``)"""
    owner: str
    team: str
    protocol: str
    generation: int
    state: str
    desired: int
    """the serving count the controller works toward (``inference.desired_replicas``)"""
    max_replicas: int | None = None
    """the autoscaler's ceiling; None when the service is not autoscaled"""
    slo_p99_ms: float | None = None
    replicas: tuple[ReplicaInfo, ...] = ()

    @property
    def ready(self) -> int:
        """Replicas that take traffic (``ServiceOut.replicas_ready``)."""
        return sum(1 for r in self.replicas if r.serving)

    @property
    def warm(self) -> int:
        """Standby replicas (``ServiceOut.replicas_warm``): warm, not draining."""
        return sum(1 for r in self.replicas if r.warm and not r.draining)


def _desired(state: str, replicas: int | None, lo: int | None, hi: int | None, scaled: int | None) -> int:
    """``inference.desired_replicas`` from the few spec fields read in SQL (the spec's
    JSON is not loaded whole: its env may be large)."""
    if state == "deleting":
        return 0
    spec = ServiceSpec.model_construct(replicas=int(replicas or 0), min_replicas=lo, max_replicas=hi)
    return desired_replicas(ServiceRow(scaled_replicas=scaled), spec)


def load_services(s: Session) -> tuple[ServiceInfo, ...]:
    """Every service with its live replicas and their GPUs: one query for the services
    (a few fields of the spec read in SQL, not the whole JSON), one for all their
    replicas with their allocations."""
    spec = ServiceRow.spec
    q = (
        select(
            ServiceRow.id,
            ServiceRow.name,
            ServiceRow.owner_id,
            User.name,
            Team.name,
            spec["protocol"].as_string(),
            spec["replicas"].as_integer(),
            spec["min_replicas"].as_integer(),
            spec["max_replicas"].as_integer(),
            spec["slo_p99_ms"].as_float(),
            ServiceRow.scaled_replicas,
            ServiceRow.generation,
            ServiceRow.state,
        )
        .join(User, User.id == ServiceRow.owner_id)
        .join(Team, Team.id == ServiceRow.team_id)
        .order_by(ServiceRow.name)
    )
    rows = s.execute(q).all()
    if not rows:
        return ()
    reps: dict[int | None, dict[int, tuple[ReplicaInfo, dict[str, list[int]]]]] = {}
    rq = (
        select(
            Job.id,
            Job.service_id,
            Job.replica,
            Job.generation,
            Job.state,
            Job.ready,
            Job.draining_at,
            Job.endpoint,
            Job.warm,
            Job.priority,
            Allocation.node,
            Allocation.gpu_index,
        )
        .outerjoin(Allocation, Allocation.job_id == Job.id)
        .where(Job.service_id.is_not(None), Job.state.in_([str(x) for x in LIVE]))
        .order_by(Job.id)
    )
    for jid, sid, slot, gen, state, ready, draining_at, endpoint, warm, prio, node, idx in s.execute(rq):
        per = reps.setdefault(sid, {})
        if jid not in per:
            info = ReplicaInfo(
                job_id=jid,
                replica=slot or 0,
                generation=gen or 0,
                state=state,
                ready=bool(ready),
                draining=draining_at is not None,
                endpoint=endpoint,
                warm=bool(warm),
                priority=int(prio or 0),
            )
            per[jid] = (info, {})
        if node is not None:
            gpus = per[jid][1].setdefault(node, [])
            if idx is not None:
                gpus.append(int(idx))
    out = []
    for sid, name, owner_id, owner, team, protocol, replicas, lo, hi, slo, scaled, generation, state in rows:
        placed = [
            replace(info, placement=tuple((n, tuple(sorted(on[n]))) for n in sorted(on)))
            for info, on in reps.get(sid, {}).values()
        ]
        live = tuple(sorted(placed, key=lambda r: (r.replica, r.job_id)))
        autoscaled = lo is not None and hi is not None and lo < hi
        out.append(
            ServiceInfo(
                name=name,
                owner_id=owner_id,
                owner=owner,
                team=team,
                protocol=protocol or "http",
                generation=generation,
                state="deleting" if state == "deleting" else "active",
                desired=_desired(state, replicas, lo, hi, scaled),
                max_replicas=int(hi) if autoscaled and hi is not None else None,
                slo_p99_ms=None if slo is None else float(slo),
                replicas=live,
            )
        )
    return tuple(out)


# -- history ----------------------------------------------------------------------------------


@dataclass(slots=True)
class ServiceHistory:
    """Per service, one sample per ``step_s`` for ``keep_s``: (time, desired, ready,
    warm, QPS). Services that are gone are forgotten at the next sample."""

    step_s: float = 5.0
    keep_s: float = 3600.0
    _rings: dict[str, deque[tuple[float, int, int, int, float | None]]] = field(default_factory=dict)
    _last: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, services: Iterable[ServiceInfo], traffic: Traffic, now: float) -> bool:
        """Note every service's counts at ``now``, unless the last sample is younger
        than ``step_s`` (then nothing: False)."""
        with self._lock:
            if self._last is not None and self._last + self.step_s > now >= self._last:
                return False
            self._last = now
            size = max(1, int(self.keep_s / self.step_s))
            seen = set()
            for x in services:
                seen.add(x.name)
                t = traffic(x.name)
                ring = self._rings.get(x.name)
                if ring is None:
                    ring = self._rings[x.name] = deque(maxlen=size)
                ring.append((now, x.desired, x.ready, x.warm, None if t is None else t.qps))
            for gone in set(self._rings) - seen:
                del self._rings[gone]
            return True

    def samples(self, service: str) -> list[tuple[float, int, int, int, float | None]]:
        with self._lock:
            return list(self._rings.get(service, ()))


# -- the page's JSON --------------------------------------------------------------------------


class FleetReplica(Reply):
    job_id: int
    replica: int = Field(description="its slot in the service")
    generation: int
    state: str = Field(description="the job's state")
    ready: bool
    draining: bool
    warm: bool = Field(description="a standby replica: ready, not in rotation")
    endpoint: str | None
    allocation: list[AllocationOut] = Field(description="its GPUs by node (none while it waits)")


class FleetServiceHistory(Reply):
    """The last hour, one sample per ``step_s`` (oldest first), each ``[time, desired,
    ready, warm, qps]`` (qps null while no gateway reports the service)."""

    step_s: float
    series: list[str]
    samples: list[tuple[float, int, int, int, float | None]]


class FleetService(Reply):
    """A service as the fleet page lists it: ``ServiceOut`` without the spec, events and
    tokens (the page polls it every few seconds), with its traffic and recent history."""

    name: str
    owner: str
    team: str
    protocol: str
    generation: int
    state: str
    replicas_desired: int
    replicas_ready: int
    replicas_warm: int
    slo_p99_ms: float | None
    traffic: ServiceTraffic | None = Field(description="from the gateways' reports, last 30 s")
    history: FleetServiceHistory
    replicas: list[FleetReplica]


HISTORY_SERIES = ["desired", "ready", "warm", "qps"]


def services_for(
    services: Iterable[ServiceInfo], actor: Principal, *, traffic: Traffic, history: ServiceHistory
) -> list[FleetService]:
    """The services ``actor`` may see, as ``GET /v1/services``: their own; operators and
    admins every one. Of anyone else's nothing is shown, not even the name (the heatmap
    marks no GPU of theirs as a service's: the snapshot gives every job only its id)."""
    return [
        FleetService(
            name=x.name,
            owner=x.owner,
            team=x.team,
            protocol=x.protocol,
            generation=x.generation,
            state=x.state,
            replicas_desired=x.desired,
            replicas_ready=x.ready,
            replicas_warm=x.warm,
            slo_p99_ms=x.slo_p99_ms,
            traffic=traffic(x.name),
            history=FleetServiceHistory(
                step_s=history.step_s, series=HISTORY_SERIES, samples=history.samples(x.name)
            ),
            replicas=[
                FleetReplica(
                    job_id=r.job_id,
                    replica=r.replica,
                    generation=r.generation,
                    state=r.state,
                    ready=r.ready,
                    draining=r.draining,
                    warm=r.warm,
                    endpoint=r.endpoint,
                    allocation=[AllocationOut(node=n, gpus=list(g)) for n, g in r.placement],
                )
                for r in x.replicas
            ],
        )
        for x in services
        if actor.is_operator or x.owner_id == actor.user_id
    ]
