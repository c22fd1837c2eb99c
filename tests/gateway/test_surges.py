"""The gateway reads its feed fast after a report that shows a surge (the server
promotes a warm replica on that report: issue 30, a step caught within seconds)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.gateway import Endpoint, Feed, GatewayConfig, Service, create_app
from gpufleet.gateway.report import Surges


@pytest.mark.parametrize(
    ("history", "now", "want"),
    [
        ([], 4, True),
        ([], 3, False),
        ([(0.5, 10), (1.0, 10)], 20, True),
        ([(0.5, 10), (1.0, 10)], 19, False),
        ([(0.5, 1), (1.0, 1)], 5, True),
        ([(0.5, 1), (1.0, 1)], 4, False),
        ([(-5.0, 100), (1.0, 2)], 8, True),
    ],
    ids=[
        "first report, 4 in flight",
        "first report, 3",
        "x2 and +10",
        "under x2",
        "x5 and +4",
        "x4 but only +3",
        "a report older than the window is forgotten",
    ],
)
def test_surge_rule(history: list[tuple[float, int]], now: int, want: bool) -> None:
    """The server's rule: at least twice the mean of the last 2 s and at least 4 more."""
    surges = Surges()
    for t, n in history:
        surges.seen(t, {"svc": n})
    assert surges.seen(2.0, {"svc": now}) is want


def test_any_service_surging_counts() -> None:
    assert Surges().seen(0.0, {"a": 0, "b": 4}) is True  # any service
    s = Surges()
    s.seen(0.0, {"a": 4})
    assert s.seen(1.0, {"a": 4}) is False


class CountingSource:
    """A source with a ``report`` (as ServerSource): counts feed reads."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.loads: list[float] = []
        self.reports: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return "counting"

    async def load(self) -> Feed | None:
        self.loads.append(asyncio.get_running_loop().time())
        return self.feed if len(self.loads) == 1 else None

    async def report(self, doc: dict[str, Any]) -> None:
        self.reports.append(doc)

    async def aclose(self) -> None:
        pass


def test_a_surge_makes_the_feed_read_fast() -> None:
    feed = Feed(
        at=1.0, services={"svc": Service(name="svc", endpoints=(Endpoint(id="1", url="http://x:1"),))}
    )

    async def run(surge: bool) -> CountingSource:
        source = CountingSource(feed)
        app = create_app(source, config=GatewayConfig(refresh_s=0.5))
        await app.start()
        if surge:
            app.metrics.service("svc")[1].inc(10)  # 10 requests in flight at the first report
        await asyncio.sleep(1.3)
        await app.stop()
        return source

    calm = asyncio.run(run(False))
    fast = asyncio.run(run(True))
    assert len(calm.loads) <= 4  # the start's read and one per 0.5 s
    assert len(fast.loads) >= len(calm.loads) + 4  # every 0.1 s after the first report
    assert 2 <= len(fast.reports) <= 3  # reports keep their pace
