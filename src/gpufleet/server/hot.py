"""Hot data: what the server keeps in memory about its agents, per process.

- latest telemetry per node (``GET /v1/nodes/{name}`` shows it; history in SQL is a
  later issue),
- heartbeats: a sync that changes nothing durable only notes the time here; a flusher
  writes all noted ``last_seen`` values in one transaction at most every ``flush_s``, so
  a fleet of idle agents costs one write a second instead of one per sync,
- the node-credential cache, and sync latency figures (``GET /v1/fleet/summary``).

One ``HotState`` per app (``app.state.hot``). With several server processes each keeps
its own telemetry; liveness is shared through the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import bindparam, update

from gpufleet.server.db import Database
from gpufleet.server.health import HealthMonitor
from gpufleet.server.models import NodeRow
from gpufleet.server.schemas import GpuTelemetry, SyncStats

log = logging.getLogger("gpufleet.server")


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

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)


@dataclass(slots=True)
class Heartbeats:
    """``last_seen`` values not yet written. ``maybe_flush`` starts one short-lived
    writer thread when a flush is due and none is running (the request never waits)."""

    flush_s: float = 1.0
    _pending: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _flushing: bool = False
    _last_flush: float = 0.0

    def note(self, node: str, at: float) -> None:
        with self._lock:
            if at > self._pending.get(node, 0.0):
                self._pending[node] = at

    def latest(self) -> dict[str, float]:
        """Sightings not yet written (the node-lifecycle loop adds them to ``last_seen``)."""
        with self._lock:
            return dict(self._pending)

    def maybe_flush(self, db: Database) -> None:
        now = time.monotonic()
        with self._lock:
            if self._flushing or not self._pending or now - self._last_flush < self.flush_s:
                return
            self._flushing, self._last_flush = True, now
        threading.Thread(target=self.flush, args=(db,), name="gpufleet-heartbeats", daemon=True).start()

    def flush(self, db: Database) -> None:
        with self._lock:
            batch, self._pending = self._pending, {}
        try:
            if batch:
                stmt = (
                    update(NodeRow)
                    .where(NodeRow.name == bindparam("n"))
                    .where(NodeRow.last_seen.is_(None) | (NodeRow.last_seen < bindparam("t")))
                    .values(last_seen=bindparam("t"))
                )
                with db.write() as s:  # one executemany: cheap in the GIL, one fsync
                    s.connection().execute(stmt, [{"n": n, "t": t} for n, t in sorted(batch.items())])
        except Exception:  # hot data: log and put back, the next flush retries
            log.exception("writing %d heartbeats failed", len(batch))
            for node, at in batch.items():
                self.note(node, at)
        finally:
            with self._lock:
                self._flushing = False


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

    def put(self, digest: str, cred: NodeCred) -> None:
        with self._lock:
            if len(self._hits) > 100_000:
                self._hits.clear()
            self._hits[digest] = (time.monotonic() + self.ttl_s, cred)


@dataclass(slots=True)
class HotState:
    telemetry: TelemetryStore = field(default_factory=TelemetryStore)
    heartbeats: Heartbeats = field(default_factory=Heartbeats)
    latencies: Latencies = field(default_factory=Latencies)
    creds: CredCache = field(default_factory=CredCache)
    health: HealthMonitor = field(default_factory=HealthMonitor)
