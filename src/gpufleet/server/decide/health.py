"""Per-GPU health rules: which telemetry takes one GPU out of service, and when it
comes back.

The rules (``HealthRules``, all configurable on ``gpufleet server``):

==================  ============================================  ===============================
rule                fires when                                     recovers
==================  ============================================  ===============================
``temperature``     above ``max_temp_c`` (85 C) for ``temp_for_s``  at or below it for
                    (30 s) without a break                         ``recover_after_s`` (10 min),
                                                                   or an operator's uncordon
``xid``             an XID in ``fatal_xids`` (48, 79, 94, 95 ...)  operator's uncordon
``ecc``             double-bit ECC errors >= ``max_ecc_dbe`` (1)   operator's uncordon
``lost``            the GPU fell off the bus (NVML lost)           operator's uncordon
``retired_pages``   retired pages >= ``max_retired_pages`` (60)    operator's uncordon
==================  ============================================  ===============================

A fired rule cordons that one GPU (not the node) and requeues the job on it; the
node-lifecycle loop (``lifecycle.py``) does that, this module only decides.
``HealthMonitor`` is hot data: the sync handler feeds it each node's telemetry; it keeps
what a rule needs to remember (how long a GPU has been hot or cool, faults seen since
the last look). After a server restart the durable cordons are in the database and the
rules start remembering afresh.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpufleet.api.nodes import GpuTelemetry

DEFAULT_FATAL_XIDS: frozenset[int] = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
RECOVERABLE: frozenset[str] = frozenset({"temperature"})
"""Rules whose cordon the server lifts by itself once the GPU is well again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthRules:
    max_temp_c: float = 85.0
    temp_for_s: float = 30.0
    recover_after_s: float = 600.0
    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    max_ecc_dbe: int = 1
    max_retired_pages: int = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """A rule that fired for one GPU: ``rule`` is its name, ``reason`` for people."""

    rule: str
    reason: str


@dataclass(slots=True)
class _GpuMemory:
    hot_since: float | None = None
    cool_since: float | None = None
    last_temp: float | None = None
    latched: dict[str, Finding] = field(default_factory=dict)
    """Findings seen since the loop last took them (an XID is an event, not a level)."""


def assess(rules: HealthRules, t: GpuTelemetry, *, hot_for_s: float) -> list[Finding]:
    """Pure: the rules one reading breaks (``hot_for_s``: how long it has been too hot)."""
    out: list[Finding] = []
    if t.lost:
        out.append(Finding(rule="lost", reason="GPU lost from the bus"))
    bad = sorted({x for x in t.xid_events if x in rules.fatal_xids})
    if bad:
        out.append(Finding(rule="xid", reason="XID " + ",".join(map(str, bad))))
    if t.ecc_dbe is not None and t.ecc_dbe >= rules.max_ecc_dbe > 0:
        out.append(Finding(rule="ecc", reason=f"{t.ecc_dbe} double-bit ECC error(s)"))
    if t.retired_pages is not None and t.retired_pages >= rules.max_retired_pages > 0:
        out.append(Finding(rule="retired_pages", reason=f"{t.retired_pages} retired pages"))
    if t.temperature_c is not None and t.temperature_c > rules.max_temp_c and hot_for_s >= rules.temp_for_s:
        out.append(
            Finding(
                rule="temperature",
                reason=f"{t.temperature_c:.0f} C above {rules.max_temp_c:.0f} C for {hot_for_s:.0f} s",
            )
        )
    return out


class HealthMonitor:
    """What the rules remember per (node, GPU index), fed by syncs, read by the loop."""

    def __init__(self, rules: HealthRules | None = None) -> None:
        self.rules = rules or HealthRules()
        self._gpus: dict[tuple[str, int], _GpuMemory] = {}
        self._lock = threading.Lock()
        self.waker: Callable[[], None] = lambda: None
        """Wakes the lifecycle loop (set by ``loops.lifecycle.lifecycle_loop``)."""

    def observe(self, node: str, telemetry: Sequence[GpuTelemetry], now: float) -> bool:
        """Note one node's readings; True if a rule fired that had not fired before."""
        fresh = False
        with self._lock:
            for t in telemetry:
                mem = self._gpus.setdefault((node, t.index), _GpuMemory())
                temp = t.temperature_c
                if temp is not None and not t.lost:
                    if temp > self.rules.max_temp_c:
                        mem.cool_since = None
                        mem.hot_since = mem.hot_since if mem.hot_since is not None else now
                    else:
                        mem.hot_since = None
                        mem.cool_since = mem.cool_since if mem.cool_since is not None else now
                    mem.last_temp = temp
                hot_for = 0.0 if mem.hot_since is None else now - mem.hot_since
                for f in assess(self.rules, t, hot_for_s=hot_for):
                    if f.rule not in mem.latched:
                        fresh = True
                    mem.latched[f.rule] = f
        if fresh:
            self.waker()
        return fresh

    def take(self) -> dict[tuple[str, int], list[Finding]]:
        """The findings since the last call (each GPU's, once), for the loop to act on."""
        with self._lock:
            out = {k: list(m.latched.values()) for k, m in self._gpus.items() if m.latched}
            for m in self._gpus.values():
                m.latched = {}
        return out

    def put_back(self, found: dict[tuple[str, int], list[Finding]]) -> None:
        """The loop could not act (e.g. the database was busy): try again next pass."""
        with self._lock:
            for k, fs in found.items():
                mem = self._gpus.setdefault(k, _GpuMemory())
                for f in fs:
                    mem.latched.setdefault(f.rule, f)

    def cool_for(self, node: str, index: int, now: float) -> float:
        """Seconds this GPU has been at or below the limit (0: hot or never seen)."""
        with self._lock:
            mem = self._gpus.get((node, index))
            if mem is None or mem.cool_since is None:
                return 0.0
            return now - mem.cool_since

    def forget(self, node: str, index: int) -> None:
        with self._lock:
            self._gpus.pop((node, index), None)

    def poke(self) -> None:
        """Wake the lifecycle loop now (a drain or rollout was started)."""
        self.waker()
