"""The agent's watch on its GPUs between syncs: samples every ``health_interval_s``,
keeps the XIDs it saw for the next sync (NVML hands an XID event out once), and says
when a GPU shows a new *kind* of fault, so the agent syncs soon instead of at its
period. The verdicts themselves are ``probe.HealthTracker``'s (the same rules the sync
reports)."""

from __future__ import annotations

import dataclasses

from gpufleet.agent.probe import GpuProbe, GpuSample, HealthTracker, ProbeError, Verdict


class HealthWatch:
    def __init__(self, probe: GpuProbe) -> None:
        self.probe = probe
        self.tracker = HealthTracker()
        self._xids: dict[int, list[int]] = {}
        self._faults: dict[int, frozenset[str]] = {}

    def for_sync(self, samples: tuple[GpuSample, ...]) -> tuple[tuple[GpuSample, ...], dict[int, Verdict]]:
        """The samples of a sync with the XIDs seen between syncs, and their verdicts."""
        if self._xids and samples:  # a failed sample keeps them for the next sync
            xids, self._xids = self._xids, {}
            samples = tuple(
                dataclasses.replace(s, xid_events=(*xids.get(s.index, ()), *s.xid_events)) for s in samples
            )
        return samples, self.tracker.update(samples)

    def check(self) -> bool:
        """Sample the GPUs now; True if a GPU shows a kind of fault it did not show at the
        last check. XIDs seen here travel with the next sync."""
        try:
            samples = self.probe.sample()
        except ProbeError:
            return False
        for s in samples:
            if s.xid_events:
                self._xids.setdefault(s.index, []).extend(s.xid_events)
        faults = {
            i: frozenset(r.split()[0] for r in v.reasons) for i, v in self.tracker.update(samples).items()
        }
        new = any(not f <= self._faults.get(i, frozenset()) for i, f in faults.items())
        self._faults = faults
        return new
