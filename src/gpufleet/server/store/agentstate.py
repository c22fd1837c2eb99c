"""What the server keeps in memory about its agents, per process (the "hot
data": latest values in memory, durable state in SQL). Nothing here touches the
database: the heartbeat rows are written by whoever flushes them (``services/sync.py``,
with ``services.nodes.write_heartbeats``).

- latest telemetry per node (``GET /v1/nodes/{name}`` shows it; history in SQL is a
  later issue),
- heartbeats: a sync that changes nothing durable, and an idle node's lease renewal,
  only note the time here; all noted ``last_seen`` values go to the group-commit writer
  at most every ``flush_s`` (the app sets a sixth of the node timeout), so a fleet of
  idle agents costs one statement every few seconds instead of one write per sync,
- idle nodes' leases (``Leases``, issue 35): what lets a renewal stand for a full sync,
- the node-credential cache, and sync latency figures (``GET /v1/fleet/summary``).

One ``AgentState`` per app (``app.state.hot``). With several server processes each keeps
its own telemetry; liveness is shared through the database.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.api.nodes import GpuTelemetry, SyncStats
from gpufleet.api.services import ServiceCounters
from gpufleet.server.decide.health import HealthMonitor
from gpufleet.server.decide.traffic import TrafficStore
from gpufleet.server.store.gpupower import PowerReadings
from gpufleet.server.store.writer import BulkOp, Writer

log = logging.getLogger("gpufleet.server")


class Relayer(Protocol):
    """Passes what one server learnt to the other servers (``pgnotify.PgNotify``)."""

    def telemetry(
        self, node: str, at: float, gpus: Sequence[GpuTelemetry], driver: str | None, cuda: str | None
    ) -> None: ...

    def traffic(self, gateway: str, at: float, services: Mapping[str, ServiceCounters]) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeTelemetry:
    at: float
    gpus: dict[int, GpuTelemetry]
    driver_version: str | None = None
    cuda_version: str | None = None


@dataclass(slots=True)
class TelemetryStore:
    _nodes: dict[str, NodeTelemetry] = field(default_factory=dict)

    def put(
        self,
        node: str,
        *,
        at: float,
        gpus: Sequence[GpuTelemetry],
        driver_version: str | None,
        cuda_version: str | None,
    ) -> None:
        old = self._nodes.get(node)
        self._nodes[node] = NodeTelemetry(
            at=at,
            gpus={g.index: g for g in gpus},
            driver_version=driver_version or (old.driver_version if old else None),
            cuda_version=cuda_version or (old.cuda_version if old else None),
        )

    def get(self, node: str) -> NodeTelemetry | None:
        return self._nodes.get(node)

    def mean_util(self, gpus: Iterable[tuple[str, int]], *, now: float, max_age_s: float) -> float | None:
        """The mean utilisation (%) of these (node, GPU index) over readings no older than
        ``max_age_s``; None without one (a service replica's load: the gateways' choice,
        the autoscaler's ``gpu_util``)."""
        vals = []
        for node, index in gpus:
            t = self._nodes.get(node)
            if t is None or now - t.at > max_age_s:
                continue
            g = t.gpus.get(index)
            if g is not None and g.utilization_pct is not None:
                vals.append(g.utilization_pct)
        return sum(vals) / len(vals) if vals else None

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)


@dataclass(slots=True)
class Heartbeats:
    """``last_seen`` values not yet written. ``maybe_flush`` hands them, when a flush is
    due and none is in flight, to the group-commit writer (they share a transaction
    with the syncs' writes; the request never waits). Until that commit they stay in
    ``latest()``."""

    flush_s: float = 1.0
    _pending: dict[str, float] = field(default_factory=dict)
    _inflight: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_flush: float = 0.0

    def note(self, node: str, at: float) -> None:
        with self._lock:
            if at > self._pending.get(node, 0.0):
                self._pending[node] = at

    def latest(self) -> dict[str, float]:
        """Sightings not yet committed (the node-lifecycle loop adds them to ``last_seen``)."""
        with self._lock:
            out = dict(self._inflight)
            for node, at in self._pending.items():
                out[node] = max(at, out.get(node, at))
            return out

    def maybe_flush(self, writer: Writer, write: BulkOp[dict[str, float], None]) -> None:
        now = time.monotonic()
        with self._lock:
            if self._inflight or not self._pending or now - self._last_flush < self.flush_s:
                return
            batch, self._pending, self._inflight, self._last_flush = self._pending, {}, self._pending, now
        writer.apply(write, batch).add_done_callback(self._written)

    def flush(self, writer: Writer, write: BulkOp[dict[str, float], None]) -> None:
        """Write what is pending now and wait for it (tests, shutdown)."""
        with self._lock:
            if self._inflight or not self._pending:
                return
            batch, self._pending, self._inflight = self._pending, {}, self._pending
        fut = writer.apply(write, batch)
        fut.add_done_callback(self._written)
        with contextlib.suppress(Exception):
            fut.result()

    def _written(self, fut: Future[None]) -> None:
        with self._lock:
            batch, self._inflight = self._inflight, {}
        error = "cancelled" if fut.cancelled() else fut.exception()
        if error is not None:  # hot data: put back, the next flush retries
            log.warning("writing %d heartbeats failed: %s", len(batch), error)
            for node, at in batch.items():
                self.note(node, at)


LEASE_MAX_S = 300.0
"""An idle node syncs in full at least this often, renewals or not (Kubernetes' kubelet
reports its node status every 5 minutes when nothing changed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    token: str
    version: str
    """The node's dispatch version read before the sync that granted it."""
    granted_at: float
    seen_at: float
    """Its grant or last renewal."""


@dataclass(slots=True)
class Leases:
    """Idle nodes' leases (Kubernetes' node lease): a full sync whose reply asks nothing
    of the node (no job, no MIG change, no upgrade order, no acknowledgement) grants one;
    while the agent has nothing new to say it renews it (``POST /v1/nodes/{name}/renew``)
    instead of syncing, and the server only notes the sighting in memory. A renewal is
    refused, and the agent syncs in full at once, when the lease is not this process's
    (another server, a restart), when the node's dispatch version moved since the grant
    (``dispatch.NodeBell``: every write that changes what a node should run rings it),
    when the node was silent for ``silence_s`` (the node timeout: a node that went
    NotReady comes back through a full sync), or ``max_age_s`` after the grant. A commit
    that reshapes the fleet (a node deleted, cordoned, registered) drops them all
    (``clear``, after the commit)."""

    silence_s: float = 30.0
    max_age_s: float = LEASE_MAX_S
    _leases: dict[str, Lease] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(self, node: str, *, version: str, at: float) -> str:
        token = secrets.token_urlsafe(12)
        with self._lock:
            self._leases[node] = Lease(token=token, version=version, granted_at=at, seen_at=at)
        return token

    def revoke(self, node: str) -> None:
        with self._lock:
            self._leases.pop(node, None)

    def clear(self) -> None:
        with self._lock:
            self._leases.clear()

    def renew(self, node: str, token: str, *, version: str, now: float) -> bool:
        """True if ``token`` is the node's lease and still stands (then renewed), else
        False (and the lease is gone: the node syncs in full)."""
        with self._lock:
            lease = self._leases.pop(node, None)
            if (
                lease is None
                or not hmac.compare_digest(lease.token.encode(), token.encode())
                or lease.version != version
                or now - lease.seen_at > self.silence_s
                or now - lease.granted_at > self.max_age_s
            ):
                return False
            self._leases[node] = Lease(
                token=lease.token, version=version, granted_at=lease.granted_at, seen_at=now
            )
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)


@dataclass(slots=True)
class Latencies:
    """Sync handling times of the last ``window_s`` seconds (at most ``size``), for the
    p50/p99 that ``GET /v1/fleet/summary`` shows; ``count`` is all syncs ever."""

    window_s: float = 60.0
    size: int = 100_000
    _values: deque[tuple[float, float]] = field(default_factory=deque)
    count: int = 0

    def add(self, seconds: float, *, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        self._values.append((at, seconds))
        while self._values and (len(self._values) > self.size or self._values[0][0] < at - self.window_s):
            self._values.popleft()
        self.count += 1

    def stats(self, *, now: float | None = None) -> SyncStats:
        since = (time.monotonic() if now is None else now) - self.window_s
        vals = sorted(v for at, v in list(self._values) if at >= since)
        if not vals:
            return SyncStats(count=self.count, p50_ms=None, p99_ms=None, max_ms=None)

        def q(p: float) -> float:
            return round(1000 * vals[min(len(vals) - 1, int(p * len(vals)))], 2)

        return SyncStats(count=self.count, p50_ms=q(0.5), p99_ms=q(0.99), max_ms=round(1000 * vals[-1], 2))


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCred:
    id: int
    node: str | None


@dataclass(slots=True)
class CredCache:
    ttl_s: float = 10.0
    _hits: dict[str, tuple[float, NodeCred]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, digest: str) -> NodeCred | None:
        with self._lock:
            hit = self._hits.get(digest)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def clear(self) -> None:
        """Forget every cached credential (a node's credentials were revoked)."""
        with self._lock:
            self._hits.clear()

    def put(self, digest: str, cred: NodeCred) -> None:
        with self._lock:
            if len(self._hits) > 100_000:
                self._hits.clear()
            self._hits[digest] = (time.monotonic() + self.ttl_s, cred)


@dataclass(slots=True)
class Revocations:
    """Revoked node-certificate serials (``services/nodecreds.refresh_revocations`` loads
    them from the database at most every ``ttl_s``; a revoke here invalidates at once)."""

    ttl_s: float = 5.0
    _serials: frozenset[str] = frozenset()
    _loaded_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = float("-inf")

    def stale(self) -> bool:
        return time.monotonic() - self._loaded_at > self.ttl_s

    def load(self, serials: frozenset[str]) -> None:
        with self._lock:
            self._serials, self._loaded_at = serials, time.monotonic()

    def revoked(self, serial: str) -> bool:
        return serial in self._serials


REJECT_KINDS = ("state", "log")
REJECT_REASONS = ("no_attempt", "unknown_job", "not_assigned", "stale_attempt")
"""Why a sync's item was dropped (``services/sync.py``): it names no attempt (state
only), no such job, a job attempt this node neither holds nor was told to stop, or
another attempt of a job this node holds or stops."""


@dataclass(slots=True)
class Rejections:
    """Items of syncs dropped because the node may not speak for them, by (kind,
    reason): ``gpufleet_sync_rejected_items_total``."""

    _counts: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, counts: Mapping[tuple[str, str], int]) -> None:
        with self._lock:
            for key, n in counts.items():
                self._counts[key] = self._counts.get(key, 0) + n

    def counts(self) -> dict[tuple[str, str], int]:
        """Every (kind, reason), zero included (a counter exists before it first counts)."""
        with self._lock:
            return {(k, r): self._counts.get((k, r), 0) for k in REJECT_KINDS for r in REJECT_REASONS}


@dataclass(slots=True)
class AgentState:
    telemetry: TelemetryStore = field(default_factory=TelemetryStore)
    heartbeats: Heartbeats = field(default_factory=Heartbeats)
    leases: Leases = field(default_factory=Leases)
    """Idle nodes' leases: their renewals stand for full syncs (issue 35)."""
    renewals: int = 0
    """Lease renewals taken since start (``gpufleet_node_renewals_total``)."""
    power: PowerReadings = field(default_factory=PowerReadings)
    """GPU power readings on their way to the node rows (``gpupower.py``)."""
    latencies: Latencies = field(default_factory=Latencies)
    creds: CredCache = field(default_factory=CredCache)
    revocations: Revocations = field(default_factory=Revocations)
    health: HealthMonitor = field(default_factory=HealthMonitor)
    rejected: Rejections = field(default_factory=Rejections)
    traffic: TrafficStore = field(default_factory=TrafficStore)
    """What the inference gateways report per service (``traffic.py``)."""
    relay: Relayer | None = None
    """Several servers on PostgreSQL (``pgnotify.py``): what this server learns of GPUs and
    gateways also goes to the others, so the leader's health rules, energy accounting and
    autoscaler see every agent and gateway, whichever server they talk to."""

    def telemetry_seen(
        self, node: str, *, at: float, gpus: Sequence[GpuTelemetry], driver: str | None, cuda: str | None
    ) -> None:
        """Readings of ``node`` (a sync here, or relayed from another server)."""
        self.telemetry.put(node, at=at, gpus=gpus, driver_version=driver, cuda_version=cuda)
        self.health.observe(node, gpus, at)  # a fired rule wakes the lifecycle loop

    def relayed_telemetry(self, d: Mapping[str, Any]) -> None:
        """Readings another server relayed (``pgnotify``'s ``m``): taken unless this server
        holds newer ones of that node. Raises on a malformed payload (the listener logs it)."""
        node, at = str(d["n"]), float(d["at"])
        have = self.telemetry.get(node)
        if have is not None and have.at >= at:
            return
        gpus = [GpuTelemetry.model_validate(g) for g in d.get("g") or ()]
        self.telemetry_seen(node, at=at, gpus=gpus, driver=d.get("d"), cuda=d.get("c"))

    def relayed_traffic(self, d: Mapping[str, Any]) -> None:
        """A gateway's report another server relayed (``pgnotify``'s ``r``)."""
        services = {str(k): ServiceCounters.model_validate(v) for k, v in (d.get("s") or {}).items()}
        self.traffic.put(str(d["gw"]), float(d["at"]), services)
