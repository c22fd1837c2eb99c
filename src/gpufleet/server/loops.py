"""One runner for periodic background work: ``Loop`` calls a step every ``interval_s``
in a daemon thread until stopped, and never dies on a failed step (logged, counted, the
next one runs on time).

New periodic tasks use it instead of a thread class of their own (the audit retention
is the first); the older loops (scheduling, lifecycle, accounting, alerts) predate it
and keep their own threads for now.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("gpufleet.server")


class Loop:
    def __init__(
        self, *, name: str, interval_s: float, step: Callable[[], object], first_after_s: float | None = None
    ) -> None:
        """``first_after_s``: the first step runs this long after ``start`` (default: one
        interval)."""
        self.name = name
        self.interval_s = interval_s
        self.step = step
        self.first_after_s = interval_s if first_after_s is None else first_after_s
        self.ticks = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        try:
            self.step()
        except Exception:  # never die: log, count, go on
            self.failures += 1
            log.exception("%s failed", self.name)
        else:
            self.ticks += 1

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"gpufleet-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        wait = self.first_after_s
        while not self._stop.wait(wait):
            self.run_once()
            wait = self.interval_s
