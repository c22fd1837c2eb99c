"""The accrual loop: every ``interval_s`` it accrues cost, energy and utilisation for
every job holding GPUs (``ledger.accrue_all``, one transaction) with the telemetry
at hand, then refreshes the soft-budget warnings (``after``; its errors fail the step,
which the runner logs and counts)."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.clock import Clock
from gpufleet.server.runner import Loop
from gpufleet.server.store import ledger
from gpufleet.server.store.db import Database


def accrual_loop(
    *,
    db: Database,
    clock: Clock,
    readings: ledger.Readings,
    interval_s: float,
    after: Callable[[float], None] | None = None,
) -> Loop:
    def step() -> int:
        now = clock.now()
        with db.write() as s:
            n = ledger.accrue_all(s, now, readings=readings)
        if after is not None:
            after(now)
        return n

    return Loop(name="accrual", step=step, interval_s=interval_s)
