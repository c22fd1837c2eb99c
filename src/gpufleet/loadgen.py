"""Open-loop HTTP load: requests leave on a schedule, whatever the answers.

Why open loop: a closed-loop client (N workers, each sending when its last answer came)
slows down with the server it measures, so a slow server is offered less load and its
queueing never shows ("coordinated omission"). Here the schedule is fixed before the
run; a request's latency counts from its *scheduled* time, so when the generator or
its connection pool falls behind, that wait is in the figures too.

Arrivals: ``poisson`` (the default) draws exponential gaps, as independent users
arrive, bursts included; with a shape whose rate changes it thins a Poisson process
at the peak rate (exact for any rate curve). ``uniform`` spaces them evenly, ``1/rate``
apart from ``t = 0``: the same schedule every run, and no bursts. Poisson is seeded.

Shapes (``rate(t)`` over ``duration_s``): ``constant`` at ``qps``; ``step`` ``qps``
until ``step_at_s`` (default: half-way), then ``peak_qps``; ``ramp`` linearly from
``qps`` to ``peak_qps``; ``sine`` between ``qps`` and ``peak_qps`` with period
``period_s``, starting at ``qps`` (a daily curve, compressed).

Results: an :class:`Interval` per ``report_every_s`` of completion time (offered: the
requests scheduled in it; achieved: the 2xx answers that completed in it, per second;
p50/p99 of those; errors by HTTP status, ``timeout`` or ``conn``; answers after the
schedule's end count in the last interval), and a :class:`Summary`. Used by
``gpufleet loadgen`` and ``bench/bench_batching.py``; it imports aiohttp when a run
starts, and no server code.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SHAPES = ("constant", "step", "ramp", "sine")
ARRIVALS = ("poisson", "uniform")


@dataclass(frozen=True, kw_only=True)
class LoadShape:
    """The offered rate over time."""

    kind: str = "constant"
    qps: float
    duration_s: float
    peak_qps: float | None = None
    """step, ramp, sine: the other rate (default: ``qps``, a constant rate)."""
    period_s: float = 60.0
    step_at_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SHAPES:
            raise ValueError(f"unknown shape {self.kind!r} (one of {', '.join(SHAPES)})")
        if self.qps <= 0 or (self.peak_qps is not None and self.peak_qps <= 0):
            raise ValueError("rates must be above 0")
        if self.duration_s <= 0 or self.period_s <= 0:
            raise ValueError("the duration and the period must be above 0")

    @property
    def peak(self) -> float:
        return self.qps if self.peak_qps is None else self.peak_qps

    def rate(self, t: float) -> float:
        """Requests per second at ``t`` seconds into the run."""
        low, high = self.qps, self.peak
        if self.kind == "step":
            at = self.duration_s / 2 if self.step_at_s is None else self.step_at_s
            return low if t < at else high
        if self.kind == "ramp":
            return low + (high - low) * min(1.0, max(0.0, t / self.duration_s))
        if self.kind == "sine":
            return low + (high - low) * (1 - math.cos(2 * math.pi * t / self.period_s)) / 2
        return low

    def max_rate(self) -> float:
        return max(self.qps, self.peak)


def schedule(shape: LoadShape, *, arrivals: str = "poisson", seed: int = 0) -> Iterator[float]:
    """Send times, seconds from the start, in order, all before ``shape.duration_s``."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r} (one of {', '.join(ARRIVALS)})")
    end = shape.duration_s - 1e-9  # float sums of 1/rate must not add one more
    if arrivals == "uniform":
        t = 0.0
        while t < end:
            yield t
            t += 1.0 / shape.rate(t)
        return
    rng = random.Random(seed)
    top = shape.max_rate()
    t = rng.expovariate(top)
    while t < end:
        if rng.random() * top <= shape.rate(t):
            yield t
        t += rng.expovariate(top)


@dataclass(frozen=True, kw_only=True)
class Target:
    """What each request is."""

    url: str
    method: str = "GET"
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    concurrency_limit: int = 1024
    """The most requests open at once; beyond it they wait for a connection (and the
    wait counts in their latency)."""


@dataclass(frozen=True, kw_only=True)
class Interval:
    start_s: float
    end_s: float
    offered_qps: float
    achieved_qps: float
    ok: int
    p50_ms: float | None
    p99_ms: float | None
    errors: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class Summary:
    duration_s: float
    """The schedule's length."""
    elapsed_s: float
    """Until the last answer."""
    sent: int
    ok: int
    errors: dict[str, int]
    offered_qps: float
    achieved_qps: float
    """2xx answers per second of ``elapsed_s``."""
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None


@dataclass(frozen=True, kw_only=True)
class Report:
    intervals: list[Interval]
    summary: Summary

    def as_json(self) -> dict[str, Any]:
        return {"intervals": [asdict(i) for i in self.intervals], "summary": asdict(self.summary)}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below it."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def kserve_body(rows: int = 1) -> bytes:
    """A KServe v2 infer request for the built-in model (``INPUT0`` FP32 [rows, 16])."""
    data = [round(0.1 * (i % 16) - 0.8, 2) for i in range(rows * 16)]
    doc = {"inputs": [{"name": "INPUT0", "shape": [rows, 16], "datatype": "FP32", "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


class _Recorder:
    """Outcomes bucketed by interval of completion, sends by interval of schedule. The
    grid covers the schedule; answers that come after its end (the drain) count in the
    last interval."""

    def __init__(self, *, every_s: float, duration_s: float) -> None:
        self.every_s = every_s
        self.duration_s = duration_s
        n = max(1, math.ceil(duration_s / every_s - 1e-9))
        self.sent = [0] * n
        self.latencies: list[list[float]] = [[] for _ in range(n)]
        self.errors: list[dict[str, int]] = [{} for _ in range(n)]
        self.all_ok: list[float] = []
        self.total_errors: dict[str, int] = {}
        self.emitted = 0

    def _index(self, at_s: float) -> int:
        return min(int(at_s / self.every_s), len(self.sent) - 1)

    def scheduled(self, at_s: float) -> None:
        self.sent[self._index(at_s)] += 1

    def done(self, at_s: float, latency_s: float, error: str | None) -> None:
        index = self._index(at_s)
        if error is None:
            self.latencies[index].append(latency_s)
            self.all_ok.append(latency_s)
        else:
            self.errors[index][error] = self.errors[index].get(error, 0) + 1
            self.total_errors[error] = self.total_errors.get(error, 0) + 1

    def emit(self, until_s: float, *, final: bool = False) -> list[Interval]:
        """The intervals that ended by ``until_s``; the last one only when ``final``."""
        out = []
        last = len(self.sent) - 1
        while self.emitted <= last:
            k = self.emitted
            start, end = k * self.every_s, min((k + 1) * self.every_s, self.duration_s)
            if not final and (k == last or end > until_s):
                break
            lat = sorted(self.latencies[k])
            span = max(end - start, 1e-9)
            p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
            out.append(
                Interval(
                    start_s=round(start, 3),
                    end_s=round(end, 3),
                    offered_qps=round(self.sent[k] / span, 2),
                    achieved_qps=round(len(lat) / span, 2),
                    ok=len(lat),
                    p50_ms=None if p50 is None else round(1000 * p50, 3),
                    p99_ms=None if p99 is None else round(1000 * p99, 3),
                    errors=dict(sorted(self.errors[k].items())),
                )
            )
            self.emitted += 1
        return out

    def summary(self, *, duration_s: float, elapsed_s: float) -> Summary:
        lat = sorted(self.all_ok)

        def ms(q: float) -> float | None:
            v = percentile(lat, q)
            return None if v is None else round(1000 * v, 3)

        sent = sum(self.sent)
        return Summary(
            duration_s=duration_s,
            elapsed_s=round(elapsed_s, 3),
            sent=sent,
            ok=len(lat),
            errors=dict(sorted(self.total_errors.items())),
            offered_qps=round(sent / duration_s, 2),
            achieved_qps=round(len(lat) / max(elapsed_s, 1e-9), 2),
            mean_ms=round(1000 * sum(lat) / len(lat), 3) if lat else None,
            p50_ms=ms(0.5),
            p90_ms=ms(0.9),
            p99_ms=ms(0.99),
            p999_ms=ms(0.999),
            max_ms=None if not lat else round(1000 * lat[-1], 3),
        )


async def run_load(
    target: Target,
    shape: LoadShape,
    *,
    arrivals: str = "poisson",
    seed: int = 0,
    report_every_s: float = 5.0,
    on_interval: Callable[[Interval], None] | None = None,
) -> Report:
    """Send ``target`` on the schedule of ``shape``; ``on_interval`` sees each interval as
    it ends. One aiohttp session, keep-alive connections up to the concurrency limit."""
    import aiohttp

    if report_every_s <= 0:
        raise ValueError("report_every_s must be above 0")
    loop = asyncio.get_running_loop()
    rec = _Recorder(every_s=report_every_s, duration_s=shape.duration_s)
    intervals: list[Interval] = []

    def publish(new: list[Interval]) -> None:
        intervals.extend(new)
        for interval in new:
            if on_interval is not None:
                on_interval(interval)

    connector = aiohttp.TCPConnector(limit=target.concurrency_limit, limit_per_host=0, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    headers = dict(target.headers)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        t0 = loop.time()

        async def one(at_s: float) -> None:
            error: str | None = None
            try:
                async with session.request(target.method, target.url, data=target.body) as resp:
                    await resp.read()
                    if not 200 <= resp.status < 300:
                        error = str(resp.status)
            except TimeoutError:
                error = "timeout"
            except aiohttp.ClientError:
                error = "conn"
            now = loop.time()
            rec.done(now - t0, now - (t0 + at_s), error)

        async def reporter() -> None:
            k = 1
            while True:
                await asyncio.sleep(max(0.0, t0 + k * report_every_s - loop.time()))
                publish(rec.emit(loop.time() - t0))
                k += 1

        tasks: set[asyncio.Task[None]] = set()
        report_task = loop.create_task(reporter())
        try:
            for at in schedule(shape, arrivals=arrivals, seed=seed):
                wait = t0 + at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                rec.scheduled(at)
                task = loop.create_task(one(at))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            report_task.cancel()
            await asyncio.gather(report_task, return_exceptions=True)
            for task in tasks:
                task.cancel()
        elapsed = loop.time() - t0
    publish(rec.emit(elapsed, final=True))
    return Report(intervals=intervals, summary=rec.summary(duration_s=shape.duration_s, elapsed_s=elapsed))


__all__ = [
    "ARRIVALS",
    "SHAPES",
    "Interval",
    "LoadShape",
    "Report",
    "Summary",
    "Target",
    "kserve_body",
    "percentile",
    "run_load",
    "schedule",
]
