"""Measured GPU power on its way from the agents' syncs to the node rows, per API process
(hot data, like ``agentstate.Heartbeats``; nothing here touches the database: the rows
are written by ``services.racks.write_gpu_power`` through the group-commit writer).

The scheduling pass runs in a child process that sees only the database, so the rack
power rule (``scheduler/power.py``) gets agents' readings from ``nodes.gpu_power``. To
keep an idle fleet from rewriting them every second, a node's readings are handed to the
writer only when

- the node's total moved from what was last written by more than ``MOVE_W`` watts *and*
  more than ``MOVE_SHARE`` of it (a dead band, as a monitoring agent's: the rack's
  headroom absorbs what it hides; a total, so busy GPUs' noise of a few percent each
  averages out instead of rewriting the row every second: issue 35), or one GPU's
  reading moved by more than ``STEP_W`` watts and ``STEP_SHARE`` of it (a job started or
  ended there, whatever the total did), or a GPU gained or lost its reading, or
- what was written is ``REFRESH_S`` old (its age tells the pass that the node still
  reports: ``services.racks.READING_MAX_AGE_S``).

Readings that are not a plausible wattage (not finite, negative, over ``MAX_GPU_W``)
are dropped: that GPU counts at its board power. Only the server that received a sync
notes it (relayed telemetry is not: several servers would write the same reading).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.server.store.writer import BulkOp, Writer

log = logging.getLogger("gpufleet.server")

MOVE_W = 10.0
MOVE_SHARE = 0.05
STEP_W = 50.0
STEP_SHARE = 0.25
REFRESH_S = 60.0
MAX_GPU_W = 5000.0
"""Above any board's power (a B200 is 1000 W): a larger figure is not a reading."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodePower:
    """One node's readings: GPU index -> watts, taken at ``at`` (the server's clock)."""

    at: float
    watts: dict[int, float]


PowerBatch = dict[str, NodePower]
"""Node -> its readings to write (one item of the writer's bulk op)."""


def readings_of(gpus: Iterable[GpuTelemetry]) -> dict[int, float]:
    """The plausible power readings of a sync's telemetry, by GPU index."""
    out: dict[int, float] = {}
    for g in gpus:
        w = g.power_w
        if w is not None and math.isfinite(w) and 0.0 <= w <= MAX_GPU_W:
            out[g.index] = float(w)
    return out


def moved(old: Mapping[int, float], new: Mapping[int, float]) -> bool:
    """Whether ``new`` differs from ``old`` past the dead bands (or in its GPUs)."""
    if old.keys() != new.keys():
        return True
    was = sum(old.values())
    if abs(sum(new.values()) - was) > max(MOVE_W, MOVE_SHARE * was):
        return True
    return any(abs(w - old[i]) > max(STEP_W, STEP_SHARE * old[i]) for i, w in new.items())


@dataclass(slots=True)
class PowerReadings:
    """Readings waiting to be written, and what was last handed to the writer per node.
    ``maybe_flush`` hands the waiting ones over at most every ``flush_s`` with none in
    flight (the heartbeats' cadence: the app sets both); a failed write puts them back."""

    flush_s: float = 1.0
    refresh_s: float = REFRESH_S
    _pending: PowerBatch = field(default_factory=dict)
    _inflight: PowerBatch = field(default_factory=dict)
    _written: PowerBatch = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_flush: float = 0.0

    def note(self, node: str, *, at: float, gpus: Iterable[GpuTelemetry]) -> bool:
        """A sync's telemetry; True if it is to be written."""
        watts = readings_of(gpus)
        with self._lock:
            base = self._pending.get(node) or self._inflight.get(node) or self._written.get(node)
            if base is not None and at - base.at < self.refresh_s and not moved(base.watts, watts):
                return False
            if not watts and (base is None or not base.watts):
                return False  # nothing measured, nothing (or nothing either) written before
            self._pending[node] = NodePower(at=at, watts=watts)
            return True

    def pending(self) -> PowerBatch:
        with self._lock:
            return dict(self._pending)

    def maybe_flush(self, writer: Writer, write: BulkOp[PowerBatch, None]) -> None:
        now = time.monotonic()
        with self._lock:
            if self._inflight or not self._pending or now - self._last_flush < self.flush_s:
                return
            batch, self._pending, self._inflight, self._last_flush = self._pending, {}, self._pending, now
        writer.apply(write, batch).add_done_callback(self._done)

    def flush(self, writer: Writer, write: BulkOp[PowerBatch, None]) -> None:
        """Write what is waiting now and wait for it (tests, shutdown)."""
        with self._lock:
            if self._inflight or not self._pending:
                return
            batch, self._pending, self._inflight = self._pending, {}, self._pending
        fut = writer.apply(write, batch)
        fut.add_done_callback(self._done)
        with contextlib.suppress(Exception):
            fut.result()

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            batch, self._inflight = self._inflight, {}
            error = "cancelled" if fut.cancelled() else fut.exception()
            if error is None:
                self._written.update(batch)
                return
            log.warning("writing %d nodes' GPU power failed: %s", len(batch), error)
            for node, reading in batch.items():  # hot data: the next flush retries
                if node not in self._pending:
                    self._pending[node] = reading
