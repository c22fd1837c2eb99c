"""Per-node telemetry history in memory: a ring buffer of downsampled samples per node,
and the last XID each GPU reported.

It is a ``TelemetryStore`` (``store/agentstate.py``) that also records what it is given, so the
sync path stays as it is: ``create_app`` builds ``AgentState(telemetry=RecordingTelemetryStore())``
once, before anything reads it (the fleet page, the collector, the alerts, the autoscaler).
Like the rest of the hot data it is per process and lost at restart; history in SQL is a
later issue. Memory: a sample is kept as its time and one ``array('d')`` of 4 floats per GPU
(NaN for a missing reading), about 330 bytes for 8 GPUs, not as tuples of float objects
(about 1,500): 50 nodes x 120 samples is 2 MB, 4,000 GPUs x 120 samples 16 MB (issue 35).
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.server.store.agentstate import TelemetryStore

FATAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""XIDs that mean the GPU (or its memory) needs attention, after NVIDIA's XID catalogue:
double-bit ECC (48), row-remap events (63/64), NVLink (74), fallen off the bus (79), ..."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One point of a node's history: per GPU index (util %, temp C, power W, memory MiB);
    a missing reading is None."""

    at: float
    gpus: tuple[tuple[float | None, float | None, float | None, float | None], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LastXid:
    code: int
    at: float


_NAN = float("nan")


def _packed(gpus: Sequence[GpuTelemetry]) -> array[float]:
    """The readings of GPUs in index order, 4 per GPU, NaN for a missing one."""
    out = array("d")
    for g in gpus:
        for v in (g.utilization_pct, g.temperature_c, g.power_w, g.memory_used_mb):
            out.append(_NAN if v is None else float(v))
    return out


def _sample(at: float, packed: array[float]) -> Sample:
    vals = [None if math.isnan(v) else v for v in packed]
    rows = tuple((vals[i], vals[i + 1], vals[i + 2], vals[i + 3]) for i in range(0, len(vals), 4))
    return Sample(at=at, gpus=rows)


class RecordingTelemetryStore(TelemetryStore):
    """Keeps at most one sample per node every ``step_s`` seconds, ``keep`` of them."""

    def __init__(self, *, step_s: float = 5.0, keep: int = 120) -> None:
        super().__init__()
        self.step_s = step_s
        self.keep = keep
        self._history: dict[str, deque[tuple[float, array[float]]]] = {}
        self._xids: dict[tuple[str, int], LastXid] = {}
        self._lock = threading.Lock()

    def put(
        self,
        node: str,
        *,
        at: float,
        gpus: Sequence[GpuTelemetry],
        driver_version: str | None,
        cuda_version: str | None,
    ) -> None:
        super().put(node, at=at, gpus=gpus, driver_version=driver_version, cuda_version=cuda_version)
        ordered = sorted(gpus, key=lambda g: g.index)
        with self._lock:
            for g in ordered:
                if g.xid_events:
                    self._xids[(node, g.index)] = LastXid(code=g.xid_events[-1], at=at)
            ring = self._history.get(node)
            if ring is None:
                ring = self._history[node] = deque(maxlen=self.keep)
            if ring and at - ring[-1][0] < self.step_s:
                return
            ring.append((at, _packed(ordered)))

    def history(self, node: str) -> list[Sample]:
        with self._lock:
            kept = list(self._history.get(node, ()))
        return [_sample(at, packed) for at, packed in kept]

    def last_xid(self, node: str, index: int) -> LastXid | None:
        return self._xids.get((node, index))

    def forget(self, node: str) -> None:
        super().forget(node)
        with self._lock:
            self._history.pop(node, None)
            for key in [k for k in self._xids if k[0] == node]:
                del self._xids[key]

    def nodes(self) -> list[str]:
        """Nodes with telemetry (a copy: safe to iterate while agents sync)."""
        return list(self._nodes)
