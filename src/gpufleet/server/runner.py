"""The one runner every control loop runs on, and the set that starts and stops them.

``Loop`` calls a *step* (a function of state: observe, then act) every ``interval_s``
in a daemon thread, and at once when woken (``wake()``: a submit, a finished job, a
health finding). It never dies on a failed step: the exception is logged, counted in
``failures``, and the loop rests ``retry_after_s`` (default: one interval) whatever
wakes it, so a step that fails at once cannot spin on wake-ups; then it waits as after
any step. ``passes`` counts the steps that returned. An *expected* failure (a lost
compare-and-set, a fenced write, a database that does not answer: ``expected``) is
logged as one line, without a traceback, and counted the same way.

Every background thread of the server is a ``Loop`` (or, for the scheduling loop in a
child process, a ``Runner`` that supervises it): the control loops of a term
(``loops/build.py``) and the process's own, HA's lease keeper (``store/leader.py``) and
``LISTEN``/``NOTIFY`` (``store/pgnotify.py``). Their shapes differ only in the step
and the wait: a step that blocks on a socket with a timeout runs with ``interval_s=0``
(``retry_after_s`` paces its reconnects); a queue's consumer (the alert webhook's
sender) is a loop woken by each put.

A *pacer* (optional) decides how long the loop rests after a step, to hold a loop
that is woken all the time to a share of the CPU (the scheduling loop's
``StormPacer``), or to gather what comes during a short gap (``Rest``). A loop whose
passes are mostly idle may rest longer after a pass that found nothing to do
(``rest``, ``Idle``): until its earliest deadline, capped, woken as ever by the events
that give it work. ``Loops`` is the one object that starts and stops a set of loops:
every loop of a term, and the process's (HA), each started in order and stopped in
reverse (the term's start is conditional on leadership). A loop may also run in a
child process (``loops/child.py``): what the rest of the server needs of a loop is ``Runner``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from gpufleet.server.errors import Conflict, Fenced

log = logging.getLogger("gpufleet.loops")


class Runner(Protocol):
    """What the server needs of a running loop: start, stop, wake, its counters."""

    @property
    def name(self) -> str: ...
    @property
    def passes(self) -> int: ...
    @property
    def failures(self) -> int: ...

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def wake(self) -> None: ...


class Pacer(Protocol):
    """How long a loop rests after a step (0: wait for the next wake-up or interval)."""

    def rest_after(self, *, started: float, ended: float, woken: bool) -> float:
        """``started``/``ended``: the step's monotonic times; ``woken``: a wake-up came
        while it ran."""
        ...

    def rested(self, *, woken: bool) -> None:
        """The rest is over; ``woken``: a wake-up came during it."""
        ...


class Loop:
    """A step run periodically in a thread, never dying on one bad step."""

    def __init__(
        self,
        *,
        name: str,
        step: Callable[[], object],
        interval_s: float,
        first_after_s: float | None = None,
        pacer: Pacer | None = None,
        on_stop: Callable[[], None] | None = None,
        retry_after_s: float | None = None,
        expected: tuple[type[Exception], ...] = (),
        rest: Callable[[], float] | None = None,
    ) -> None:
        """``first_after_s``: the first step runs this long after ``start`` (default:
        one interval, or at once if woken). ``on_stop``: called once the thread has
        ended (to close what the step used, e.g. the LISTEN connection).
        ``retry_after_s``: the rest after a failed step, whatever wakes the loop
        (default: one interval); then it waits as after any step (an interval or a
        wake-up). ``expected``: failures logged as one line (besides
        ``Conflict`` and ``Fenced``), e.g. a database's errors for a step that talks
        to it and nothing else. ``rest``: how long to wait after a step that returned
        (default: one interval), asked after each such step: a loop whose last pass
        found nothing to do sleeps until its earliest deadline (``Idle``); a wake-up
        still ends the wait at once."""
        self.name = name
        self.step = step
        self.interval_s = interval_s
        self.first_after_s = interval_s if first_after_s is None else first_after_s
        self.pacer = pacer
        self.on_stop = on_stop
        self.retry_after_s = interval_s if retry_after_s is None else retry_after_s
        self.expected: tuple[type[Exception], ...] = (Conflict, Fenced, *expected)
        self.rest = rest
        self.passes = 0
        self.failures = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def run_once(self) -> bool:
        """One step; True if it returned. Never raises."""
        try:
            self.step()
        except self.expected as exc:  # contention, a newer leader, no database: no traceback
            self.failures += 1
            log.warning("%s: %s", self.name, (str(exc).splitlines() or [type(exc).__name__])[0])
            return False
        except Exception:  # never die: log, count, go on
            self.failures += 1
            log.exception("%s failed", self.name)
            return False
        self.passes += 1
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"gpufleet-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.on_stop is not None:
            self.on_stop()

    def _run(self) -> None:
        wait = self.first_after_s
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            started = time.monotonic()
            ok = self.run_once()
            wait = self.interval_s
            if not ok:  # rest whatever wakes us: a failing step must not spin
                self._stop.wait(self.retry_after_s)
                continue
            if self.rest is not None:
                wait = self.rest()
            if self.pacer is not None:
                woken = self._wake.is_set()
                rest = self.pacer.rest_after(started=started, ended=time.monotonic(), woken=woken)
                if rest > 0:
                    self._stop.wait(rest)
                    self.pacer.rested(woken=self._wake.is_set())


class Idle:
    """A loop's ``rest`` that follows its last pass: one interval while the pass found
    work (``busy``), else until the earliest time-based work it knows of falls due
    (``until``), never less than one interval nor more than ``cap_s`` (work that no
    event announces, or a deadline that moved, is looked at again within ``cap_s``)."""

    def __init__(self, interval_s: float, cap_s: float) -> None:
        self.interval_s = interval_s
        self.cap_s = max(cap_s, interval_s)
        self.wait_s = interval_s

    def busy(self) -> None:
        self.wait_s = self.interval_s

    def until(self, due_in_s: float | None) -> None:
        """Nothing to do now; the earliest deadline is ``due_in_s`` away (None: none)."""
        due = self.cap_s if due_in_s is None else due_in_s
        self.wait_s = min(self.cap_s, max(self.interval_s, due))

    def __call__(self) -> float:
        return self.wait_s


class Rest:
    """A pacer that rests ``gap_s`` after every step: what comes meanwhile (wake-ups,
    queued items) is taken by the next step together (the NOTIFY sender's coalescing)."""

    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s

    def rest_after(self, *, started: float, ended: float, woken: bool) -> float:
        return self.gap_s

    def rested(self, *, woken: bool) -> None:
        pass


class Relay:
    """Stands for the runner of this name in the current term (HA: loops run on the
    leader only, and a new term builds new ones), so routers and ``/metrics`` hold one
    object. ``wake`` also calls ``notify`` (the other servers: ``pgnotify.py``)."""

    def __init__(self, name: str, notify: Callable[[], None] | None = None) -> None:
        self.name = name
        self.target: Runner | None = None
        self.notify = notify
        self._passes = 0
        self._failures = 0

    @property
    def passes(self) -> int:
        t = self.target
        return self._passes + (t.passes if t is not None else 0)

    @property
    def failures(self) -> int:
        t = self.target
        return self._failures + (t.failures if t is not None else 0)

    def follow(self, target: Runner | None) -> None:
        """The current term's runner (None: no term); counters keep counting across terms."""
        old = self.target
        if old is not None:
            self._passes += old.passes
            self._failures += old.failures
        self.target = target

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def wake(self) -> None:
        self.wake_here()
        if self.notify is not None:
            self.notify()

    def wake_here(self) -> None:
        t = self.target
        if t is not None:
            t.wake()


class Loops:
    """Every loop of the process as one: ``start`` in order, ``stop`` in reverse."""

    def __init__(self, runners: Sequence[Runner] = ()) -> None:
        self.runners = list(runners)
        self.running = False

    def add(self, runner: Runner) -> Runner:
        self.runners.append(runner)
        return runner

    def __getitem__(self, name: str) -> Runner:
        for r in self.runners:
            if r.name == name:
                return r
        raise KeyError(name)

    def start(self) -> None:
        for r in self.runners:
            r.start()
        self.running = True

    def stop(self) -> None:
        for r in reversed(self.runners):
            try:
                r.stop()
            except Exception:
                log.exception("stopping %s failed", r.name)
        self.running = False
