"""The balancer's rules, as tables against the real ``Pool`` (no I/O, a fake clock)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from gpufleet.gateway.balancer import (
    Balancer,
    Endpoint,
    Feed,
    Outcome,
    OutlierPolicy,
    Pool,
    Service,
    parse_feed,
    util_rank,
)


def ep(i: int, util: float | None = None, url: str | None = None) -> Endpoint:
    return Endpoint(id=f"1.{i}", url=url or f"http://10.0.0.{i}:8000", replica=i, gpu_util=util)


def svc(*endpoints: Endpoint, name: str = "llm") -> Service:
    return Service(name=name, endpoints=endpoints)


def pool(*endpoints: Endpoint, **policy: float) -> Pool:
    return Pool(svc(*endpoints), OutlierPolicy(**policy))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Pick:
    name: str
    utils: list[float | None]
    in_flight: list[int]
    want: set[int]
    """Indices any of which may be chosen (the first choice, from a fresh pool)."""


PICKS = [
    Pick("fewest in flight wins", [None, None, None], [2, 0, 1], {1}),
    Pick("in flight beats utilisation", [90.0, 10.0], [0, 1], {0}),
    Pick("lower utilisation breaks a tie", [80.0, 20.0, 50.0], [1, 1, 1], {1}),
    Pick("unknown utilisation ranks as busy", [None, 95.0, 40.0], [0, 0, 0], {2}),
    Pick("same 10-point band is a tie", [31.0, 38.0], [0, 0], {0, 1}),
]


@pytest.mark.parametrize("case", PICKS, ids=[c.name for c in PICKS])
def test_choose(case: Pick) -> None:
    p = pool(*(ep(i, u) for i, u in enumerate(case.utils)))
    for slot, n in zip(p.slots, case.in_flight, strict=True):
        slot.in_flight = n
    chosen = p.choose(0.0)
    assert chosen is not None and p.slots.index(chosen) in case.want


def test_round_robin_among_ties() -> None:
    p = pool(ep(0), ep(1), ep(2))
    seen = Counter(p.choose(0.0).endpoint.id for _ in range(30))  # type: ignore[union-attr]
    assert seen == {"1.0": 10, "1.1": 10, "1.2": 10}


def test_in_flight_spreads_concurrent_requests() -> None:
    p = pool(ep(0), ep(1))
    a, b = p.choose(0.0), None
    assert a is not None
    p.begin(a)
    b = p.choose(0.0)
    assert b is not None and b is not a


@pytest.mark.parametrize(
    ("utils", "want"),
    [((None,), 10), ((0.0,), 0), ((9.9,), 0), ((35.0,), 3), ((100.0,), 10), ((250.0,), 10), ((-5.0,), 0)],
    ids=["none", "zero", "9.9", "35", "100", "over", "negative"],
)
def test_util_rank(utils: tuple[float | None], want: int) -> None:
    assert util_rank(utils[0]) == want


@dataclass(frozen=True)
class Eject:
    name: str
    endpoints: int
    outcomes: list[Outcome]
    """Ends of requests on endpoint 0, one after another at t=0."""
    ejected: bool


EJECTS = [
    Eject("connection failure ejects at once", 2, [Outcome.CONNECTION_FAILED], True),
    Eject("four 5xx do not", 2, [Outcome.HTTP_5XX] * 4, False),
    Eject("five 5xx in a row do", 2, [Outcome.HTTP_5XX] * 5, True),
    Eject(
        "a success resets the count", 2, [Outcome.HTTP_5XX] * 4 + [Outcome.OK] + [Outcome.HTTP_5XX] * 4, False
    ),
    Eject("an abandoned request is no verdict", 2, [Outcome.ABANDONED] * 9, False),
    Eject("a lone endpoint is never ejected", 1, [Outcome.CONNECTION_FAILED], False),
    Eject("busy (503, connect timeout while serving) is no verdict", 2, [Outcome.BUSY] * 9, False),
    Eject("a closed keep-alive connection is no verdict", 2, [Outcome.CLOSED] * 9, False),
    Eject(
        "no verdict keeps a 5xx streak as it was",
        2,
        [Outcome.HTTP_5XX] * 4 + [Outcome.BUSY, Outcome.CLOSED] + [Outcome.HTTP_5XX],
        True,
    ),
]


@pytest.mark.parametrize("case", EJECTS, ids=[c.name for c in EJECTS])
def test_ejection(case: Eject) -> None:
    p = pool(*(ep(i) for i in range(case.endpoints)))
    s = p.slots[0]
    for outcome in case.outcomes:
        p.begin(s)
        p.end(s, outcome, 0.0)
    assert s.ejected(0.0) is case.ejected
    assert s.in_flight == 0


@pytest.mark.parametrize(
    ("endpoints", "max_out"), [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (10, 5)], ids=lambda v: str(v)
)
def test_never_more_than_half_ejected(endpoints: int, max_out: int) -> None:
    p = pool(*(ep(i) for i in range(endpoints)))
    for s in p.slots:
        p.begin(s)
        p.end(s, Outcome.CONNECTION_FAILED, 0.0)
    assert p.ejected_count(0.0) == max_out
    assert p.choose(0.0) is not None


def test_a_cap_skips_full_endpoints_and_none_when_all_are_full() -> None:
    p = pool(ep(0), ep(1))
    p.slots[0].in_flight, p.slots[1].in_flight = 4, 3
    assert p.choose(0.0, cap=4) is p.slots[1]
    p.slots[1].in_flight = 4
    assert p.choose(0.0, cap=4) is None  # overload: the gateway answers 503 itself
    assert p.choose(0.0) is not None  # no cap
    p.slots[1].in_flight = 0
    assert p.choose(0.0, avoid=p.slots[1], cap=4) is None


def test_ejected_endpoint_gets_nothing_then_returns_and_time_doubles() -> None:
    p = pool(ep(0), ep(1), base_ejection_s=10.0, max_ejection_s=25.0)
    bad = p.slots[0]
    assert p.eject(bad, 0.0)
    assert {p.choose(t).endpoint.id for t in (1.0, 2.0, 9.9)} == {"1.1"}  # type: ignore[union-attr]
    assert not bad.ejected(10.0)
    assert {p.choose(10.0).endpoint.id for _ in range(2)} == {"1.0", "1.1"}  # type: ignore[union-attr]
    assert p.eject(bad, 11.0) and bad.ejected_until == 31.0  # second time: 20 s
    assert p.eject(bad, 31.0) and bad.ejected_until == 56.0  # third: 40 s, capped at 25
    assert p.eject(bad, 56.0 + 25.0) and bad.ejected_until == 81.0 + 10.0  # back 25 s: forgotten


def test_all_ejected_falls_back_to_all() -> None:
    b = Balancer(OutlierPolicy())
    b.update(Feed(at=1.0, services={"llm": svc(ep(0), ep(1))}))
    p = b.pool("llm")
    assert p is not None and p.eject(p.slots[0], 0.0)
    b.update(Feed(at=2.0, services={"llm": svc(ep(0))}))  # the healthy one left the feed
    assert p.choose(1.0) is p.slots[0]


def test_update_keeps_state_of_endpoints_that_stay() -> None:
    b = Balancer()
    b.update(Feed(at=1.0, services={"llm": svc(ep(0), ep(1)), "old": svc(ep(5), name="old")}))
    p = b.pool("llm")
    assert p is not None
    s0, s1 = p.slots
    p.begin(s0)
    p.begin(s1)
    p.eject(s1, 0.0)
    b.update(Feed(at=2.0, services={"llm": svc(ep(1, util=50.0), ep(2))}))
    assert b.pool("llm") is p and b.pool("old") is None
    kept, new = p.slots
    assert kept is s1 and kept.in_flight == 1 and kept.ejected(1.0) and kept.endpoint.gpu_util == 50.0
    assert new.in_flight == 0 and new.endpoint.id == "1.2"
    p.end(s0, Outcome.OK, 1.0)  # a request on a departed endpoint still ends cleanly
    assert s0.in_flight == 0
    b.update(Feed(at=3.0, services={"llm": svc(ep(1, url="http://10.9.9.9:1"))}))
    assert p.slots[0] is not s1  # same id, new URL: a new replica


@pytest.mark.parametrize(
    ("doc", "services", "skipped"),
    [
        ({"at": 1, "services": []}, set(), 0),
        (
            {
                "at": 1,
                "services": [
                    {
                        "name": "a",
                        "tokens": ["AB"],
                        "rate": {"burst": 2, "per_s": 1},
                        "endpoints": [{"id": 1, "url": "u/"}],
                    },
                    {"name": "b", "endpoints": [{"id": "x"}, {"id": "y", "url": "http://y"}]},
                    {"name": "c", "rate": {"burst": 0, "per_s": 1}},
                    {"nom": "d"},
                ],
            },
            {"a", "b"},
            3,
        ),
    ],
    ids=["empty", "bad entries skipped"],
)
def test_parse_feed(doc: object, services: set[str], skipped: int) -> None:
    feed = parse_feed(doc)
    assert set(feed.services) == services and len(feed.skipped) == skipped
    if "a" in services:
        a = feed.services["a"]
        assert a.tokens == {"ab"} and a.rate is not None and a.endpoints[0].url == "u"
        assert [e.id for e in feed.services["b"].endpoints] == ["y"]


@pytest.mark.parametrize("doc", [[], {"at": 1}, {"services": {}}, {"at": "x", "services": []}], ids=str)
def test_parse_feed_rejects_non_feeds(doc: object) -> None:
    with pytest.raises(ValueError):
        parse_feed(doc)


def test_traffic_report_reads_the_gateways_own_counters() -> None:
    """What a gateway reports to the server: codes, in flight and the latency histogram
    per service, cumulative; +Inf sent as a finite bound (JSON has no infinity)."""
    from gpufleet.api.services import GatewayReport
    from gpufleet.gateway.metrics import GatewayMetrics
    from gpufleet.gateway.report import INF, traffic_report

    m = GatewayMetrics()
    for code in (200, 200, 503):
        m.answered("svc", code)
    latency, inflight = m.service("svc")
    latency.observe(0.004)
    latency.observe(0.2)
    inflight.inc()
    body = traffic_report(m.registry, "gw-1")
    got = body["services"]["svc"]
    assert got["codes"] == {"200": 2, "503": 1} and got["inflight"] == 1
    assert got["latency"]["count"] == 2 and got["latency"]["le"][-1] == INF
    assert got["latency"]["counts"][-1] == 2
    GatewayReport.model_validate(body)  # what the server accepts
