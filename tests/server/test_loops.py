"""The loop runner (``server/runner.py``): steps run periodically and when woken,
never die on a failing step, rest after one (``retry_after_s``, also for a step that
waits on its own with no interval), and ``Loops`` starts and stops every loop as one; a
fixed rest after each step coalesces wake-ups (``Rest``); the scheduling loop's pacing
against wake-up storms (``StormPacer``). In process, steps stubbed."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from gpufleet.server.loops.scheduling import StormPacer
from gpufleet.server.runner import Loop, Loops, Rest


def _until(cond: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.005)


def test_the_loop_runs_steps_and_survives_a_failing_one() -> None:
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first step fails")

    loop = Loop(name="t", interval_s=0.01, step=step, first_after_s=0)
    loop.start()
    deadline = time.monotonic() + 5
    while loop.passes < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.stop()
    assert loop.failures == 1 and loop.passes >= 2


def test_a_failing_step_rests_an_interval_whatever_wakes_it() -> None:
    calls: list[float] = []

    def step() -> None:
        calls.append(time.monotonic())
        raise RuntimeError("always")

    loop = Loop(name="t", interval_s=0.3, step=step, first_after_s=0)
    loop.start()
    try:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # woken all the time
            loop.wake()
            time.sleep(0.001)
    finally:
        loop.stop()
    assert 1 <= len(calls) <= 2 and loop.failures == len(calls) and loop.passes == 0


def test_a_wakeup_runs_the_step_at_once_and_stop_calls_on_stop() -> None:
    ran = threading.Event()
    stopped: list[str] = []
    loop = Loop(name="t", interval_s=60.0, step=ran.set, on_stop=lambda: stopped.append("closed"))
    loop.start()
    try:
        time.sleep(0.02)
        assert not ran.is_set()  # the first step waits an interval...
        loop.wake()  # ...unless woken
        assert ran.wait(2.0)
    finally:
        t0 = time.monotonic()
        loop.stop()
    assert time.monotonic() - t0 < 2.0  # stop does not wait out the interval
    assert stopped == ["closed"]


def test_a_step_that_waits_itself_runs_back_to_back_and_its_failures_rest_retry_after_s() -> None:
    """``interval_s=0``: the step waits on its own (LISTEN's socket); a failing one must
    not spin: it rests ``retry_after_s``, whatever wakes the loop."""
    calls: list[float] = []

    def step() -> None:
        calls.append(time.monotonic())
        if len(calls) > 3:
            raise ConnectionError("lost")
        time.sleep(0.01)  # waits on its socket

    loop = Loop(name="t", interval_s=0.0, first_after_s=0.0, retry_after_s=0.3, step=step)
    loop.start()
    try:
        _until(lambda: len(calls) >= 5)
        for _ in range(50):
            loop.wake()
            time.sleep(0.001)
    finally:
        loop.stop()
    assert loop.passes == 3 and loop.failures == len(calls) - 3
    gaps = [b - a for a, b in itertools.pairwise(calls[3:])]
    assert min(gaps) >= 0.29  # each failure rested, wake-ups or not
    assert max(b - a for a, b in itertools.pairwise(calls[:4])) < 0.25  # passes back to back


def test_rest_coalesces_a_storm_of_wakeups() -> None:
    ran: list[float] = []
    loop = Loop(name="t", interval_s=60.0, first_after_s=60.0, pacer=Rest(0.05), step=lambda: ran.append(1))
    loop.start()
    try:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            loop.wake()
            time.sleep(0.0005)
    finally:
        loop.stop()
    assert 3 <= len(ran) <= 0.5 / 0.05 + 2


class _Recorder:
    def __init__(self, name: str, log: list[str], *, fail_stop: bool = False) -> None:
        self.name, self.log, self.fail_stop = name, log, fail_stop
        self.passes = self.failures = 0

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail_stop:
            raise RuntimeError("cannot stop")

    def wake(self) -> None:
        pass


def test_loops_start_in_order_and_stop_in_reverse_even_past_a_failing_stop() -> None:
    log: list[str] = []
    loops = Loops([_Recorder("a", log), _Recorder("b", log, fail_stop=True)])
    loops.add(_Recorder("c", log))
    loops.start()
    assert loops.running and loops["b"].name == "b"
    loops.stop()
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]
    assert not loops.running
    with pytest.raises(KeyError):
        loops["nope"]


# -- the loop's pacing (in process, passes stubbed) ----------------------------------------------


class _Counting:
    """A scheduling step that only records when it ran and takes ``pass_s``; on pass
    ``miss`` it ends as if the submitters had not had the CPU while it ran (no wake-up
    seen), as happens on a busy machine."""

    def __init__(self, *, pass_s: float, miss: int = 0) -> None:
        self.pass_s = pass_s
        self.miss = miss
        self.ran: list[float] = []
        self.pacer = StormPacer(max_rest_s=1.0)
        self.loop = Loop(name="t", step=self, interval_s=1.0, first_after_s=1.0, pacer=self.pacer)

    def __call__(self) -> None:
        self.ran.append(time.monotonic())
        time.sleep(self.pass_s)
        if len(self.ran) == self.miss:
            self.loop._wake.clear()

    def start(self) -> None:
        self.loop.start()

    def wake(self) -> None:
        self.loop.wake()

    def stop(self) -> None:
        self.loop.stop()


@pytest.mark.parametrize("pass_s", [0.001, 0.02], ids=["short-passes", "longer-passes"])
def test_storm_of_wakeups_is_coalesced(pass_s: float) -> None:
    """Woken all the time, passes start at most every ``storm_gap_s``, or every
    (1 + busy_factor) pass durations when that is longer."""
    loop = _Counting(pass_s=pass_s)
    loop.start()
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # a submit storm: a wake-up every 0.5 ms
            loop.wake()
            time.sleep(0.0005)
    finally:
        loop.stop()
    gaps = [b - a for a, b in zip(loop.ran[2:], loop.ran[3:], strict=False)]
    pacer = loop.pacer
    assert len(loop.ran) <= 1.0 / max(pacer.storm_gap_s, (1 + pacer.busy_factor) * pass_s) + 4
    assert min(gaps) >= min(pacer.storm_gap_s, (1 + pacer.busy_factor) * pass_s) * 0.9


def test_a_pass_the_submitters_miss_does_not_end_the_storm() -> None:
    loop = _Counting(pass_s=0.001, miss=5)
    loop.start()
    try:
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            loop.wake()
            time.sleep(0.0005)
    finally:
        loop.stop()
    gaps = [b - a for a, b in zip(loop.ran[2:], loop.ran[3:], strict=False)]
    assert len(loop.ran) >= 7
    assert min(gaps) >= loop.pacer.storm_gap_s * 0.9


def test_lone_wakeup_is_served_at_once() -> None:
    loop = _Counting(pass_s=0.001)
    loop.start()
    try:
        time.sleep(0.05)  # past the first (interval) wait's start
        for _ in range(3):
            t0 = time.monotonic()
            loop.wake()
            while len(loop.ran) == 0 or loop.ran[-1] < t0:
                assert time.monotonic() - t0 < 0.5, "not woken"
                time.sleep(0.0005)
            assert loop.ran[-1] - t0 < 0.25  # not held back (the interval is 1 s)
            time.sleep(0.1)  # idle again
    finally:
        loop.stop()
