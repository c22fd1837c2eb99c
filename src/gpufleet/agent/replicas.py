"""Service replicas on a node, as the agent sees them: readiness probes of their health
path, and on simulated GPUs the utilisation their model server reports (its busy time).

Probes run from the agent's tick, at most every ``interval_s`` per replica, each with a
``timeout_s``: a replica is ready when its health path answers 2xx/3xx on its node port
(``$PORT``, ``free_port``)."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence

import httpx

from gpufleet.agent.jobs import LocalJob
from gpufleet.agent.replicamodels import ModelConverger

Key = tuple[int, int]
BUSY_METRIC = "gpufleet_model_busy_seconds_total"


class ReplicaProbes:
    def __init__(self, *, interval_s: float, timeout_s: float) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._ready: dict[Key, tuple[bool, float]] = {}
        """(ready, when last probed, monotonic)."""
        self._busy: dict[Key, tuple[float, float, float]] = {}
        """(busy seconds, when read, utilisation 0..1 since the reading before)."""
        self._http: httpx.Client | None = None
        self.models = ModelConverger(timeout_s=timeout_s)
        """The service's wished models on each replica (``replicamodels``): converged at
        each successful probe; a replica with wishes is ready once one pass ran."""

    def ready(self, key: Key) -> bool:
        return self._ready.get(key, (False, 0.0))[0] and not self.models.gates(key)

    def util(self, key: Key) -> float | None:
        got = self._busy.get(key)
        return None if got is None else got[2]

    def probe(self, jobs: Sequence[LocalJob], *, simulated: bool) -> bool:
        """Probe the replicas that are due; True if one's readiness changed. On
        ``simulated`` GPUs, also read each ready replica's busy time."""
        changed = False
        now = time.monotonic()
        live = {j.key for j in jobs}
        for table in (self._ready, self._busy):
            for key in [k for k in table if k not in live]:
                del table[key]
        for job in jobs:
            at = self._ready.get(job.key, (False, -1e18))[1]
            if now - at < self.interval_s:
                continue
            was = self.ready(job.key)
            ok = self._get_ok(job, job.health_path or "/")
            self._ready[job.key] = (ok, now)
            if ok and job.port is not None:
                changed |= self.models.converge(job.key, job.port, self._client())
            changed |= self.ready(job.key) != was
            if ok and simulated:
                self._read_busy(job, now)
        return changed

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(timeout=self.timeout_s, trust_env=False)
        return self._http

    def _get_ok(self, job: LocalJob, path: str) -> bool:
        try:
            r = self._client().get(f"http://127.0.0.1:{job.port}{path}")
        except httpx.HTTPError:
            return False
        return 200 <= r.status_code < 400

    def _read_busy(self, job: LocalJob, now: float) -> None:
        """A replica's utilisation follows its model server's busy time: ``BUSY_METRIC``
        on its ``/metrics`` (the built-in model server's; a server without it keeps the
        agent's default load)."""
        try:
            r = self._client().get(f"http://127.0.0.1:{job.port}/metrics")
            busy = busy_seconds(r.text) if r.status_code == 200 else None
        except httpx.HTTPError:
            busy = None
        if busy is None:
            return
        prev = self._busy.get(job.key)
        util = 0.0
        if prev is not None and now > prev[1]:
            util = min(1.0, max(0.0, (busy - prev[0]) / (now - prev[1])))
        self._busy[job.key] = (busy, now, util)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


def busy_seconds(text: str) -> float | None:
    """The sum of ``BUSY_METRIC`` in a Prometheus text page (None: not there)."""
    from prometheus_client.parser import text_string_to_metric_families

    total, seen = 0.0, False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == BUSY_METRIC:
                    total += sample.value
                    seen = True
    except ValueError:
        return None
    return total if seen else None


def free_port() -> int:
    """A TCP port of this node nobody listens on now (the kernel's pick); the replica
    binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])
