"""What must follow a write once it has committed: the one convention for side effects.

A service (or a loop's step) *marks*, inside its transaction, what its commit must be
followed by: ``wake_scheduler(s)`` (a job, node, quota or reservation changed what the
next pass can place), ``wake_replicas(s)`` (a service's spec changed),
``wake_lifecycle(s)`` (a drain or rollout started), ``wake_diagnosis(s)`` (a failed
attempt's output queued for diagnosis), ``invalidate_fleets(s)`` (a node's
shape changed: the fleet caches of ``services/inventory.py``), ``refresh_budgets(s)``
(a budget changed: the warnings a submit reads); and the nodes whose agents must sync
(``dispatch.touch``). Routers never wake or invalidate by hand, and services are handed
no callbacks: what a commit sets off is wired once, at assembly (``app.py``:
``Database.after_commit``).

The marks live on the session (``Session.info``), so they commit or vanish with it:
``Database.write`` and the group-commit writer (``writer.py``) run the hooks only after
the commit, never after a rollback; a function the group commit runs in a SAVEPOINT
that it rolls back (it raised, or returned a ``Failure``) leaves its marks behind too
(``save`` and ``restore``). Waking early would be wrong, not just wasteful: a scheduling pass
woken before the commit reads the old rows and sleeps for a period.

A hook runs on the thread that committed (a request's, or the group commit's writer
thread), after the commit and before the callers are answered: it must be quick (set
an event, drop a cache, one small read at most). A hook that raises is logged and the
others still run: the write has committed, and its caller is told so.

Loops that wake each other outside a write (the health monitor waking the lifecycle
loop on a fresh finding, a gateway's load report waking the autoscaler) do so directly:
there is no commit to wait for.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

KEY = "gpufleet.after_commit"
"""The ``Session.info`` key of a transaction's ``Marks``."""


class Effect(enum.Enum):
    """What a commit may set off; the hooks run in this order (a cache is dropped before
    the loop that may read it is woken)."""

    INVALIDATE_FLEETS = "invalidate_fleets"
    REFRESH_BUDGETS = "refresh_budgets"
    WAKE_SCHEDULER = "wake_scheduler"
    WAKE_REPLICAS = "wake_replicas"
    WAKE_LIFECYCLE = "wake_lifecycle"
    WAKE_DIAGNOSIS = "wake_diagnosis"


@dataclass(slots=True)
class Marks:
    """What one transaction marked so far."""

    effects: set[Effect] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    """The nodes whose agents must sync (``dispatch.py``)."""

    def copy(self) -> Marks:
        return Marks(effects=set(self.effects), nodes=set(self.nodes))

    def __bool__(self) -> bool:
        return bool(self.effects or self.nodes)


def marks(s: Session) -> Marks:
    """The marks of ``s``'s transaction (made on first use)."""
    got: Marks | None = s.info.get(KEY)
    if got is None:
        got = s.info[KEY] = Marks()
    return got


def mark(s: Session, *effects: Effect) -> None:
    marks(s).effects.update(effects)


def touch(s: Session, nodes: Iterable[str]) -> None:
    marks(s).nodes.update(nodes)


def wake_scheduler(s: Session) -> None:
    mark(s, Effect.WAKE_SCHEDULER)


def wake_replicas(s: Session) -> None:
    mark(s, Effect.WAKE_REPLICAS)


def wake_lifecycle(s: Session) -> None:
    mark(s, Effect.WAKE_LIFECYCLE)


def wake_diagnosis(s: Session) -> None:
    mark(s, Effect.WAKE_DIAGNOSIS)


def invalidate_fleets(s: Session) -> None:
    mark(s, Effect.INVALIDATE_FLEETS)


def refresh_budgets(s: Session) -> None:
    mark(s, Effect.REFRESH_BUDGETS)


def take(s: Session) -> Marks:
    """The marks of ``s``, forgotten from it (the caller runs them, or drops them)."""
    got: Marks | None = s.info.pop(KEY, None)
    return got if got is not None else Marks()


def save(s: Session) -> Marks:
    """A copy of the marks so far, for ``restore`` if a SAVEPOINT is rolled back."""
    got: Marks | None = s.info.get(KEY)
    return got.copy() if got is not None else Marks()


def restore(s: Session, saved: Marks) -> None:
    s.info[KEY] = saved
