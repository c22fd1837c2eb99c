"""``PlanCache``: what ``plan()`` may keep from one pass to the next, owned by the caller.

The core itself holds no state between calls (no module globals, no locks). A caller
that runs pass after pass over mostly the same objects (the simulator: the same Fleet
and the same RunningJob/JobRequest objects for ~180,000 passes; the server's loop: the
same Fleet while no node changes) creates one ``PlanCache`` and hands it to every
``plan(..., cache=...)`` call; then the fleet's static index, the running jobs' GPU
holdings, the occupancy (derived from the last pass's by difference), the preemption
ranking and the policies' per-job keys are reused instead of rebuilt.

Every entry is keyed by object identity and keeps a strong reference to its object (a
policy: a weak one, and its memo goes with it), so an id cannot be reused while cached.
Reuse never changes an answer: a plan with a cache equals the plan without one
(tests/test_plan_cache.py).

Not thread-safe, by design: one cache per scheduling loop (thread or process). The core
takes no locks; two threads sharing one cache is a caller bug.
"""

from __future__ import annotations

import weakref
from typing import Any

from gpufleet.scheduler.capacity import FleetIndex
from gpufleet.scheduler.model import Fleet

PolicyMemo = dict[str, dict[int, Any]]
"""One policy object's memos, by name (e.g. ``"order"``: id(JobRequest) -> (key, job)).
Each value holds its object, so a hit is checked with ``is``."""


class PlanCache:
    """Per-caller memo for ``plan()``. ``max_fleets``: Fleet objects whose index is kept
    (least recently used goes first; the simulator alternates between the healthy fleet
    and the one with current outages). ``max_policies`` likewise for policy objects."""

    __slots__ = ("_indexes", "_policies", "max_fleets", "max_policies")

    def __init__(self, *, max_fleets: int = 8, max_policies: int = 8) -> None:
        self.max_fleets = max_fleets
        self.max_policies = max_policies
        self._indexes: dict[int, tuple[Fleet, FleetIndex]] = {}
        self._policies: dict[int, tuple[weakref.ref[object], PolicyMemo]] = {}

    def index(self, fleet: Fleet) -> FleetIndex:
        """The FleetIndex of ``fleet`` (built on first use). It carries the per-fleet
        memos (holdings, occupancy, options, preemption ranking): they live as long as
        this cache keeps the index."""
        hit = self._indexes.pop(id(fleet), None)
        if hit is None or hit[0] is not fleet:
            hit = (fleet, FleetIndex(fleet))
            while len(self._indexes) >= self.max_fleets:
                self._indexes.pop(next(iter(self._indexes)))
        self._indexes[id(fleet)] = hit  # most recently used last
        return hit[1]

    def policy_memo(self, policy: object) -> PolicyMemo:
        """The memos of one policy object (its keys depend on its parameters, so two
        policy objects never share one). Held only while the policy object lives: a
        caller that makes a policy per pass does not pile up dead policies' memos."""
        hit = self._policies.get(id(policy))
        if hit is None or hit[0]() is not policy:
            if len(self._policies) >= self.max_policies:
                self._policies.pop(next(iter(self._policies)))
            key, table = id(policy), self._policies

            def forget(ref: weakref.ref[object]) -> None:
                if table.get(key, (None,))[0] is ref:
                    del table[key]

            hit = table[key] = (weakref.ref(policy, forget), {})
        return hit[1]

    def clear(self) -> None:
        """Forget everything (the next pass rebuilds, as with no cache)."""
        self._indexes.clear()
        self._policies.clear()
