"""Per-GPU health rules: which telemetry takes one GPU out of service, and when it
comes back.

The rules (``HealthRules``, all configurable on ``gpufleet server``):

==================  ============================================  ===============================
rule                fires when                                     recovers
==================  ============================================  ===============================
``temperature``     at or above ``max_temp_c`` (85 C, ``--gpu-     below it for
                    temp-limit``) for ``temp_for_s`` (30 s)        ``recover_after_s`` (10 min),
                    without a break                                or an operator's uncordon
``xid``             an XID in ``fatal_xids`` (48, 79, 94, 95 ...)  operator's uncordon
``ecc``             volatile double-bit ECC errors >=              operator's uncordon
                    ``max_ecc_dbe`` (1)
``lost``            the GPU fell off the bus (NVML lost)           operator's uncordon
``retired_pages``   retired pages >= ``max_retired_pages`` (60)    operator's uncordon
``pcie``            its PCIe link below the GPU's and slot's max   operator's uncordon
                    in ``pcie_reports`` (3) reports in a row: the
                    width in any report, the generation only in
                    reports under load (an idle GPU lowers it)
``nvlink``          NVLink links down (supported, inactive)        operator's uncordon
``ecc_mode``        ECC off on a GPU that supports it              operator's uncordon
                    (``require_ecc``)
==================  ============================================  ===============================

The link and ECC-mode judgements are ``gpufleet.gpuchecks``' (the agent's preflight
makes the same ones before the node takes work, ``agent/preflight.py``).

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

from gpufleet import gpuchecks
from gpufleet.api.nodes import GpuTelemetry

DEFAULT_FATAL_XIDS: frozenset[int] = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
RECOVERABLE: frozenset[str] = frozenset({"temperature"})
"""Rules whose cordon the server lifts by itself once the GPU is well again."""


PcieTally = tuple[int, int]
"""(reports in a row with the link's width below its max, reports under load in a row
with its generation below its max)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthRules:
    max_temp_c: float = 85.0
    temp_for_s: float = 30.0
    recover_after_s: float = 600.0
    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    max_ecc_dbe: int = 1
    max_retired_pages: int = 60
    pcie_reports: int = 3
    """Reports in a row a PCIe shortfall must show before it cordons (0: the rule is off)."""
    nvlink: bool = True
    require_ecc: bool = True


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
    pcie_low: PcieTally = (0, 0)
    latched: dict[str, Finding] = field(default_factory=dict)
    """Findings seen since the loop last took them (an XID is an event, not a level)."""


def pcie_tally(prev: PcieTally, t: GpuTelemetry) -> PcieTally:
    """Pure: the tally after one more reading. The width is judged in every reading; the
    generation only under load (an idle reading neither counts nor clears it); a reading
    without the fields changes nothing."""
    width_low, gen_low = prev
    if t.pcie_width is not None and t.pcie_max_width is not None:
        width_low = width_low + 1 if 0 < t.pcie_width < t.pcie_max_width else 0
    if (
        t.pcie_gen is not None
        and t.pcie_max_gen is not None
        and gpuchecks.is_busy(t.utilization_pct, t.throttle_reasons)
    ):
        gen_low = gen_low + 1 if 0 < t.pcie_gen < t.pcie_max_gen else 0
    return width_low, gen_low


def assess(
    rules: HealthRules, t: GpuTelemetry, *, hot_for_s: float, pcie_low: PcieTally = (0, 0)
) -> list[Finding]:
    """Pure: the rules one reading breaks (``hot_for_s``: how long it has been too hot;
    ``pcie_low``: ``pcie_tally`` up to and with this reading)."""
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
    if t.temperature_c is not None and t.temperature_c >= rules.max_temp_c and hot_for_s >= rules.temp_for_s:
        out.append(
            Finding(
                rule="temperature",
                reason=f"{t.temperature_c:.0f} C, at or above {rules.max_temp_c:.0f} C for {hot_for_s:.0f} s",
            )
        )
    n = rules.pcie_reports
    if n > 0 and (pcie_low[0] >= n or pcie_low[1] >= n):
        why = gpuchecks.pcie_downtrained(
            gen=t.pcie_gen,
            max_gen=t.pcie_max_gen,
            width=t.pcie_width if pcie_low[0] >= n else None,
            max_width=t.pcie_max_width,
            busy=pcie_low[1] >= n,
        )
        if why:
            out.append(Finding(rule="pcie", reason=f"{why} ({max(pcie_low)} reports in a row)"))
    if rules.nvlink and (why := gpuchecks.nvlink_down(t.nvlink_down)):
        out.append(Finding(rule="nvlink", reason=why))
    if rules.require_ecc and (why := gpuchecks.ecc_off(t.ecc_enabled)):
        out.append(Finding(rule="ecc_mode", reason=why))
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
                    if temp >= self.rules.max_temp_c:
                        mem.cool_since = None
                        mem.hot_since = mem.hot_since if mem.hot_since is not None else now
                    else:
                        mem.hot_since = None
                        mem.cool_since = mem.cool_since if mem.cool_since is not None else now
                    mem.last_temp = temp
                hot_for = 0.0 if mem.hot_since is None else now - mem.hot_since
                mem.pcie_low = pcie_tally(mem.pcie_low, t)
                for f in assess(self.rules, t, hot_for_s=hot_for, pcie_low=mem.pcie_low):
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
        """Seconds this GPU has been below the limit (0: hot or never seen)."""
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
