"""The retention loop: deletes audit rows older than ``--audit-days`` (``audit.purge``,
in chunks) and the logs of jobs that ended more than ``--log-days`` ago
(``services.logs.purge``, in batches of jobs), hourly at most, first a minute after
start."""

from __future__ import annotations

from gpufleet.clock import Clock
from gpufleet.server.runner import Loop
from gpufleet.server.services import audit, logs
from gpufleet.server.store.db import Database


def retention_loop(*, db: Database, clock: Clock, keep_s: float, log_keep_s: float | None = None) -> Loop:
    every = min(3600.0, max(1.0, min(keep_s, log_keep_s or keep_s) / 10))

    def step() -> None:
        audit.purge(db, before=clock.now() - keep_s)
        if log_keep_s is not None:
            logs.purge(db, before=clock.now() - log_keep_s)

    return Loop(name="audit-retention", interval_s=every, step=step, first_after_s=min(60.0, every))
