"""The retention loop: deletes audit rows older than ``--audit-days`` (``audit.purge``,
in chunks), the logs of jobs that ended more than ``--log-days`` ago
(``services.logs.purge``, in batches of jobs) and the diagnoses done as long ago
(``services.diagnoses.purge``; never younger than two days: the suspicion rule counts a
day of them), hourly at most, first a minute after start."""

from __future__ import annotations

from gpufleet.clock import Clock
from gpufleet.server.runner import Loop
from gpufleet.server.services import audit, diagnoses, logs
from gpufleet.server.store.db import Database

DIAGNOSES_MIN_KEEP_S = 2 * 86_400.0
"""Diagnoses are kept at least this long whatever ``--log-days`` says (evidence window: 1 day)."""


def retention_loop(*, db: Database, clock: Clock, keep_s: float, log_keep_s: float | None = None) -> Loop:
    every = min(3600.0, max(1.0, min(keep_s, log_keep_s or keep_s) / 10))

    def step() -> None:
        audit.purge(db, before=clock.now() - keep_s)
        if log_keep_s is not None:
            now = clock.now()
            logs.purge(db, before=now - log_keep_s)
            diagnoses.purge(db, before=now - max(log_keep_s, DIAGNOSES_MIN_KEEP_S))

    return Loop(name="audit-retention", interval_s=every, step=step, first_after_s=min(60.0, every))
