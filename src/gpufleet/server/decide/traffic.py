"""What the gateways saw, per service: their reports (``POST /v1/gateway/report``, after
every feed read; cumulative counters per gateway process, like Prometheus counters) kept
in memory for a few minutes, and rates over a window from them (the autoscaler's
``qps`` and ``inflight`` metrics, the page, ``/metrics``).

Rates are per gateway (newest report minus the oldest inside the window), then summed,
so gateways that start, stop or restart (their counters reset: a report whose counters
went down starts that gateway's history over) never make a rate negative. Quantiles
come from the summed bucket increments, linearly inside a bucket (Prometheus'
``histogram_quantile``). A gateway silent for ``forget_s`` is dropped.

A report's bad entries (not a service's name, malformed counters) never reach the
store: they are skipped and counted here by reason (``rejected``,
``gpufleet_gateway_report_rejected_items_total``), the report's other entries taken.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from gpufleet.api.services import ServiceCounters, ServiceTraffic

KEEP_S = 360.0


@dataclass(frozen=True, slots=True)
class _Report:
    at: float
    codes: dict[str, int]
    inflight: int
    le: tuple[float, ...]
    buckets: tuple[int, ...]
    total: int


def _report(at: float, c: ServiceCounters) -> _Report:
    lat = c.latency
    if lat is None or len(lat.le) != len(lat.counts):
        return _Report(at, dict(c.codes), c.inflight, (), (), 0)
    return _Report(at, dict(c.codes), c.inflight, tuple(lat.le), tuple(lat.counts), lat.count)


def quantile(q: float, le: tuple[float, ...], increments: list[int]) -> float | None:
    """The ``q`` quantile (seconds) of cumulative bucket increments over bounds ``le``."""
    if not increments or increments[-1] <= 0:
        return None
    rank = q * increments[-1]
    prev_bound, prev_count = 0.0, 0
    for bound, count in zip(le, increments, strict=True):
        if count >= rank:
            if bound >= 1e9:  # +Inf (a gateway sends 1e9: JSON has no infinity)
                return prev_bound
            span = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / span if span else 1.0)
        prev_bound, prev_count = bound, count
    return prev_bound


SURGE_FACTOR, SURGE_MIN, SURGE_WINDOW_S = 2.0, 4, 2.0
"""A report's in-flight requests for a service surged when they are at least
``SURGE_FACTOR`` times the mean of the gateway's reports over the last
``SURGE_WINDOW_S`` and ``SURGE_MIN`` more: the panic rule's own factor and window (its
demand is that mean: every report of a step, and of the window after it, wakes the
autoscaler, so the mean has caught up at a wake however often the gateway reports), and a
floor so that 0 -> 1 -> 2 at a light load wakes nothing."""


def surged(before: float, now: int) -> bool:
    return now >= SURGE_FACTOR * before and now - before >= SURGE_MIN


REJECT_REASONS = ("name", "counters")
"""Why a report's entry was skipped (``api.services.SkipReason``)."""
_NOTED_MAX = 1024


@dataclass(slots=True)
class TrafficStore:
    forget_s: float = 60.0
    _series: dict[tuple[str, str], deque[_Report]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rejected: dict[str, int] = field(default_factory=dict)
    _noted: set[tuple[str, str]] = field(default_factory=set)
    _surge_until: dict[tuple[str, str], float] = field(default_factory=dict)

    def reject(self, gateway: str, skipped: dict[str, str]) -> list[tuple[str, str]]:
        """Count a report's skipped entries (name: reason); answers (name cut to 64
        characters, reason) of those this gateway had not sent bad before (for one log
        line each, not one per report)."""
        news: list[tuple[str, str]] = []
        with self._lock:
            for name, reason in skipped.items():
                self._rejected[reason] = self._rejected.get(reason, 0) + 1
                key = (gateway, name[:64])
                if key not in self._noted and len(self._noted) < _NOTED_MAX:
                    self._noted.add(key)
                    news.append((name[:64], reason))
        return news

    def rejected(self) -> dict[str, int]:
        """Skipped report entries by reason since start, every reason (zero included)."""
        with self._lock:
            return {r: self._rejected.get(r, 0) for r in REJECT_REASONS}

    def put(self, gateway: str, at: float, services: dict[str, ServiceCounters]) -> list[str]:
        """Keep a report; answers the services whose demand surged at this gateway
        (``surged``) in this report or within ``SURGE_WINDOW_S`` before it: the caller
        wakes the autoscaler for them at each such report rather than leave a load step
        to its next period, until the panic window's mean has taken all of the step in
        (a replica promoted on the first wake is ready at once, and the next decision,
        which may need the whole step in the mean, is a report away, not a period)."""
        surging: list[str] = []
        with self._lock:
            for name, counters in services.items():
                rep = _report(at, counters)
                series = self._series.setdefault((gateway, name), deque())
                if series and sum(series[-1].codes.values()) > sum(rep.codes.values()):
                    series.clear()  # the gateway restarted: its counters began again
                recent = [r.inflight for r in series if r.at >= at - SURGE_WINDOW_S]
                if surged(sum(recent) / len(recent) if recent else 0.0, rep.inflight):
                    self._surge_until[(gateway, name)] = at + SURGE_WINDOW_S
                if at <= self._surge_until.get((gateway, name), -1.0):
                    surging.append(name)
                series.append(rep)
                while series and series[0].at < at - KEEP_S:
                    series.popleft()
        return surging

    def _live(self, now: float) -> dict[tuple[str, str], deque[_Report]]:
        for key in [k for k, v in self._series.items() if not v or v[-1].at < now - self.forget_s]:
            del self._series[key]
            self._surge_until.pop(key, None)
        return self._series

    def stats(self, service: str, now: float, window_s: float = 30.0) -> ServiceTraffic | None:
        """Rates over the last ``window_s``; None when no gateway reported the service."""
        with self._lock:
            series = [v for (_, name), v in self._live(now).items() if name == service]
            if not series:
                return None
            requests = errors = inflight = 0
            inflight_avg = 0.0
            span = 0.0
            le: tuple[float, ...] = ()
            merged: list[int] = []
            for reps in series:
                last = reps[-1]
                inflight += last.inflight
                recent = [r.inflight for r in reps if r.at >= now - window_s] or [last.inflight]
                inflight_avg += sum(recent) / len(recent)
                first = next((r for r in reps if r.at >= now - window_s), last)
                if first is last and len(reps) > 1:
                    first = reps[-2]
                if first is last:
                    continue
                span = max(span, last.at - first.at)
                for code, n in last.codes.items():
                    d = n - first.codes.get(code, 0)
                    requests += d
                    if code.startswith("5"):
                        errors += d
                if last.le and (last.le == first.le or not first.le):
                    before = first.buckets if first.le else (0,) * len(last.buckets)  # no answer yet then
                    inc = [b - a for a, b in zip(before, last.buckets, strict=True)]
                    if not le:
                        le, merged = last.le, inc
                    elif le == last.le:
                        merged = [x + y for x, y in zip(merged, inc, strict=True)]
        p50, p99 = quantile(0.5, le, merged), quantile(0.99, le, merged)
        return ServiceTraffic(
            window_s=round(span, 3),
            qps=round(requests / span, 3) if span > 0 else 0.0,
            error_rate=round(errors / requests, 5) if requests else 0.0,
            inflight=inflight,
            inflight_avg=round(inflight_avg, 3),
            p50_ms=None if p50 is None else round(p50 * 1000, 3),
            p99_ms=None if p99 is None else round(p99 * 1000, 3),
            gateways=len(series),
        )

    def totals(self, now: float) -> dict[str, tuple[dict[str, int], tuple[float, ...], list[int], int]]:
        """Per service, summed over live gateways: (requests by code, bucket bounds,
        cumulative bucket counts, in flight), for ``/metrics``."""
        out: dict[str, tuple[dict[str, int], tuple[float, ...], list[int], int]] = {}
        with self._lock:
            for (_, name), reps in self._live(now).items():
                last = reps[-1]
                codes, le, buckets, inflight = out.get(name, ({}, last.le, [0] * len(last.le), 0))
                for code, n in last.codes.items():
                    codes[code] = codes.get(code, 0) + n
                if le == last.le:
                    buckets = [a + b for a, b in zip(buckets, last.buckets, strict=True)]
                out[name] = (codes, le, buckets, inflight + last.inflight)
        return out
