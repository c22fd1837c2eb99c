"""The job state machine: every state and every allowed transition, in one table.

::

    PENDING --schedule--> SCHEDULED --agent reports running--> RUNNING
    RUNNING --exit 0--> COMPLETED        RUNNING --exit != 0--> FAILED
    PENDING|HELD|SCHEDULED|RUNNING --cancel--> CANCELLED
    SCHEDULED|RUNNING --time limit passed--> TIMEOUT
    SCHEDULED --agent reports exited before running--> COMPLETED | FAILED
    SCHEDULED|RUNNING --preempted by the plan--> PREEMPTED --> PENDING (same id, history kept)
    SCHEDULED|RUNNING --requeue (node lost / operator)--> REQUEUED --> PENDING
    PENDING <--hold/release--> HELD

PREEMPTED and REQUEUED are transit states: they are written as a job event and then
immediately left for PENDING in the same transaction, so a job is never *at rest* in
them. A job that leaves SCHEDULED/RUNNING keeps ``stopping_on`` (the node that still has
to confirm it stopped); it is not placed again before that node confirms.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    HELD = "HELD"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"


S = JobState

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.HELD, S.CANCELLED}),
    S.HELD: frozenset({S.PENDING, S.CANCELLED}),
    S.SCHEDULED: frozenset(
        {S.RUNNING, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.PREEMPTED, S.REQUEUED}
    ),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT, S.PREEMPTED, S.REQUEUED}),
    S.PREEMPTED: frozenset({S.PENDING}),
    S.REQUEUED: frozenset({S.PENDING}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMEOUT: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE: frozenset[JobState] = frozenset({S.SCHEDULED, S.RUNNING})
"""States in which a job holds an allocation."""


def allowed(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]
