"""The audit-retention loop: deletes audit rows older than ``--audit-days``
(``audit.purge``, in chunks), hourly at most, first a minute after start."""

from __future__ import annotations

from gpufleet.server import audit
from gpufleet.server.clock import Clock
from gpufleet.server.db import Database
from gpufleet.server.loops.runner import Loop


def retention_loop(*, db: Database, clock: Clock, keep_s: float) -> Loop:
    every = min(3600.0, max(1.0, keep_s / 10))
    return Loop(
        name="audit-retention",
        interval_s=every,
        step=lambda: audit.purge(db, before=clock.now() - keep_s),
        first_after_s=min(60.0, every),
    )
