"""The diagnosis loop (issue 34): reads the output of failed job attempts that nodes
queued (``services/diagnoses.py``), attaches what it matched to the job, and raises
the suspicion of the node when the signature blames it.

Transitions: a queued ``job_diagnoses`` row -> done (with or without a finding); a
job's ``diagnosis`` set or replaced by a higher-ranking finding (a job event); a node
suspect (a fleet event) -> cordoned with its evidence (``decide/suspicion.py``). One row
per transaction; a row that fails is logged and marked done, never retried for ever.
It polls (every ``interval_s``): queuing happens inside nodes' syncs, and a diagnosis a
second or two after the exit is soon enough. On a single server (``idle_s`` > the
interval, SQLite) a pass that found nothing queued rests up to ``idle_s``: the sync that
queues a row wakes it once committed (``effects.wake_diagnosis``; ``build.py`` wires
it). Under HA that sync may commit on another server, so the leader keeps polling.
"""

from __future__ import annotations

from gpufleet.clock import Clock
from gpufleet.server.decide.suspicion import DiagnosisConfig
from gpufleet.server.runner import Idle, Loop
from gpufleet.server.services.diagnoses import diagnose_queued
from gpufleet.server.store.db import Database


def diagnosis_loop(
    *, db: Database, clock: Clock, config: DiagnosisConfig, interval_s: float = 1.0, idle_s: float = 1.0
) -> Loop:
    idle = Idle(interval_s, idle_s)

    def step() -> None:
        n = diagnose_queued(db, config=config, now=clock.now())
        while n >= 50:  # a backlog: the next batch at once
            n = diagnose_queued(db, config=config, now=clock.now())
        if n:
            idle.busy()
        else:
            idle.until(None)  # nothing queued: the next sync that queues a row wakes us

    return Loop(name="diagnosis", interval_s=interval_s, step=step, rest=idle)
