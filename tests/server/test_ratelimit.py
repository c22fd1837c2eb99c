"""The rate-limit machinery on a fake clock (``ratelimit.py``) and the lanes' seats and
queues (``lanes.Lane``) on an event loop; the HTTP behaviour is ``test_limits_api.py``."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.clock import FakeClock
from gpufleet.ratelimit import AuthThrottle, Buckets, KnownDigests, Rate
from gpufleet.server.http.lanes import Lane, LaneName

# Each step: advance the clock by this many seconds, then take this many tokens.
BUCKET_CASES = [
    pytest.param(Rate(burst=3, per_s=1), [(0, 1)] * 4, [0, 0, 0, 1.0], id="burst-then-refused"),
    pytest.param(
        Rate(burst=3, per_s=1), [(0, 1)] * 3 + [(0.5, 1), (0.5, 1)], [0, 0, 0, 0.5, 0], id="refills-at-rate"
    ),
    pytest.param(Rate(burst=2, per_s=10), [(100, 1), (0, 1), (0, 1)], [0, 0, 0.1], id="never-above-burst"),
    pytest.param(Rate(burst=5, per_s=1), [(0, 10), (0, 1)], [0, 1.0], id="cost-above-burst-costs-burst"),
    pytest.param(
        Rate(burst=2, per_s=1), [(0, 2), (0, 2), (1, 1)], [0, 2.0, 0], id="refused-take-takes-nothing"
    ),
    pytest.param(Rate(burst=30, per_s=10), [(0, 10)] * 4, [0, 0, 0, 1.0], id="list-page-of-1000-costs-10"),
    pytest.param(
        Rate(burst=30, per_s=10),
        [(0, 1)] * 30 + [(0, 1), (0.1, 1)],
        [0] * 30 + [0.1, 0],
        id="default-user-rate",
    ),
]


@pytest.mark.parametrize(("rate", "steps", "want"), BUCKET_CASES)
def test_bucket(rate: Rate, steps: list[tuple[float, float]], want: list[float]) -> None:
    clock = FakeClock()
    buckets = Buckets(now=clock.now)
    got = []
    for advance, cost in steps:
        clock.advance(advance)
        got.append(round(buckets.take("alice", rate, cost), 6))
    assert got == want


PARSE_CASES = [
    pytest.param("30/10", Rate(burst=30, per_s=10), id="burst-per-second"),
    pytest.param("20/1m", Rate(burst=20, per_s=20 / 60), id="n-per-window"),
    pytest.param("5/500ms", Rate(burst=5, per_s=10), id="window-in-ms"),
    pytest.param(" 300/100 ", Rate(burst=300, per_s=100), id="spaces"),
    pytest.param("off", None, id="off"),
    pytest.param("0", None, id="zero-is-off"),
]


@pytest.mark.parametrize(("text", "want"), PARSE_CASES)
def test_rate_parse(text: str, want: Rate | None) -> None:
    assert Rate.parse(text) == want


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("fast", id="words"),
        pytest.param("0/5", id="no-burst"),
        pytest.param("5/0", id="no-refill"),
        pytest.param("5/0s", id="empty-window"),
        pytest.param("5/-1", id="negative"),
    ],
)
def test_rate_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        Rate.parse(text)


def test_buckets_are_per_key_and_follow_a_rate_change() -> None:
    clock = FakeClock()
    buckets = Buckets(now=clock.now)
    user, admin = Rate(burst=2, per_s=1), Rate(burst=10, per_s=5)
    assert [buckets.take("alice", user) for _ in range(3)] == [0, 0, 1.0]
    assert buckets.take("bob", user) == 0  # bob has his own bucket
    assert buckets.take("alice", admin) == 0.2  # promoted: same (empty) bucket, the new refill rate
    clock.advance(10)
    assert [buckets.take("alice", admin) for _ in range(10)] == [0] * 10  # and the new burst


def test_buckets_forget_full_buckets_when_many() -> None:
    clock = FakeClock()
    buckets = Buckets(now=clock.now, max_keys=4)
    rate = Rate(burst=2, per_s=1)
    for key in ("a", "b", "c", "d"):
        buckets.take(key, rate)
    clock.advance(5)  # all full again: nothing to remember
    buckets.take("busy", rate, 2)
    buckets.take("e", rate)
    assert len(buckets) <= 4
    assert buckets.take("busy", rate) == 1.0  # a bucket in use is kept


THROTTLE_CASES = [
    pytest.param(Rate(burst=3, per_s=3 / 60), 2, 0.0, 0.0, id="under-the-limit"),
    pytest.param(Rate(burst=3, per_s=3 / 60), 3, 0.0, 20.0, id="n-failures-block"),
    pytest.param(Rate(burst=3, per_s=3 / 60), 3, 20.0, 0.0, id="one-failure-refilled"),
    pytest.param(Rate(burst=3, per_s=3 / 60), 5, 0.0, 20.0, id="more-failures-same-wait"),
    pytest.param(None, 100, 0.0, 0.0, id="off"),
]


@pytest.mark.parametrize(("rate", "failures", "later", "want"), THROTTLE_CASES)
def test_auth_throttle(rate: Rate | None, failures: int, later: float, want: float) -> None:
    clock = FakeClock()
    throttle = AuthThrottle(rate, Buckets(now=clock.now))
    for _ in range(failures):
        throttle.failed("10.0.0.1")
    clock.advance(later)
    assert round(throttle.retry_after("10.0.0.1"), 6) == want
    assert throttle.retry_after("10.0.0.2") == 0.0  # per address


# -- lanes ----------------------------------------------------------------------------------


def _lane(seats: int = 2, queue: int = 2, wait_s: float = 5.0) -> Lane:
    return Lane(LaneName.USER, seats=seats, queue=queue, wait_s=wait_s)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_lane_seats_then_queue_then_refusal() -> None:
    async def run() -> list[object]:
        lane = _lane(seats=2, queue=1)
        first, second = await lane.enter(1), await lane.enter(1)
        third = asyncio.ensure_future(lane.enter(1))
        await _settle()
        fourth = await lane.enter(1)  # the queue (1) is full
        waiting = (third.done(), lane.queued)
        lane.leave(1)
        await _settle()
        return [first, second, fourth, waiting, third.result(), lane.free, lane.queued]

    assert asyncio.run(run()) == [True, True, False, (False, 1), True, 0, 0]


def test_lane_wait_runs_out() -> None:
    async def run() -> tuple[bool, int, int]:
        lane = _lane(seats=1, queue=4, wait_s=0.05)
        await lane.enter(1)
        waited = await lane.enter(1)
        return waited, lane.queued, lane.free

    assert asyncio.run(run()) == (False, 0, 0)


def test_lane_wide_request_waits_its_turn_and_narrow_ones_behind_it() -> None:
    async def run() -> list[object]:
        lane = _lane(seats=4, queue=4)
        await lane.enter(3)
        wide = asyncio.ensure_future(lane.enter(2))  # 1 seat free: waits
        await _settle()
        narrow = asyncio.ensure_future(lane.enter(1))  # FIFO: behind the wide one
        await _settle()
        before = (wide.done(), narrow.done())
        lane.leave(3)
        await _settle()
        return [before, wide.result(), narrow.result(), lane.free]

    assert asyncio.run(run()) == [(False, False), True, True, 1]


def test_lane_cancelled_waiter_gives_up_its_place() -> None:
    async def run() -> list[object]:
        lane = _lane(seats=1, queue=4)
        await lane.enter(1)
        gone = asyncio.ensure_future(lane.enter(1))
        after = asyncio.ensure_future(lane.enter(1))
        await _settle()
        gone.cancel()
        await _settle()
        lane.leave(1)
        await _settle()
        return [gone.cancelled(), after.result(), lane.free, lane.queued]

    assert asyncio.run(run()) == [True, True, 0, 0]


def test_lane_serves_users_in_turn_not_in_arrival_order() -> None:
    """A busy user's queue does not hold a quiet user back: flows are served round
    robin, each in its own FIFO."""

    async def run() -> list[str]:
        lane = _lane(seats=1, queue=10)
        await lane.enter(1, "busy")
        order: list[str] = []

        async def ask(flow: str, label: str) -> None:
            await lane.enter(1, flow)
            order.append(label)

        tasks = [asyncio.ensure_future(ask("busy", f"b{i}")) for i in range(4)]
        await _settle()
        tasks.append(asyncio.ensure_future(ask("quiet", "q0")))
        await _settle()
        for _ in range(5):
            lane.leave(1)
            await _settle()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(run()) == ["b0", "q0", "b1", "b2", "b3"]


def test_lane_wide_head_of_the_next_flow_is_not_passed() -> None:
    async def run() -> list[object]:
        lane = _lane(seats=4, queue=4)
        await lane.enter(3, "a")
        wide = asyncio.ensure_future(lane.enter(2, "b"))  # its turn, but 1 seat free
        await _settle()
        narrow = asyncio.ensure_future(lane.enter(1, "c"))  # after b's turn
        await _settle()
        before = (wide.done(), narrow.done(), lane.queued)
        lane.leave(3)
        await _settle()
        return [before, wide.result(), narrow.result(), lane.free, lane.queued]

    assert asyncio.run(run()) == [(False, False, 2), True, True, 1, 0]


def test_lane_abandoned_flow_leaves_the_turns() -> None:
    async def run() -> list[object]:
        lane = _lane(seats=1, queue=4, wait_s=0.05)
        await lane.enter(1, "a")
        timed_out = await lane.enter(1, "b")  # waits 50 ms, then gives up
        after = asyncio.ensure_future(lane.enter(1, "c"))
        await _settle()
        lane.leave(1)
        await _settle()
        return [timed_out, after.result(), lane.free, lane.queued]

    assert asyncio.run(run()) == [False, True, 0, 0]


@pytest.mark.parametrize(
    ("seats", "asked", "want"),
    [
        pytest.param(8, 1, 1, id="one-seat"),
        pytest.param(8, 3, 3, id="a-page-of-300"),
        pytest.param(8, 10, 4, id="a-page-of-1000-takes-half-the-lane"),
        pytest.param(1, 10, 1, id="a-one-seat-lane"),
    ],
)
def test_lane_width(seats: int, asked: int, want: int) -> None:
    assert _lane(seats=seats).width(asked) == want


# -- the live credentials a throttled address's unknown token is checked against ------------


def test_known_digests_reload_when_stale_or_invalidated() -> None:
    clock = FakeClock()
    stored = {"a"}
    loads: list[float] = []

    def load() -> frozenset[str]:
        loads.append(clock.now())
        return frozenset(stored)

    known = KnownDigests(load=load, refresh_s=2.0, now=clock.now)
    assert known.stale() and not known.holds(["a"])  # nothing read yet
    known.reload()
    assert known.holds(["x", "a"]) and not known.holds(["b"])
    stored.add("b")
    known.reload()  # not stale: no second read
    assert not known.holds(["b"]) and len(loads) == 1
    known.invalidate()  # this server made a credential
    known.reload()
    assert known.holds(["b"]) and len(loads) == 2
    clock.advance(2.0)
    assert known.stale()
