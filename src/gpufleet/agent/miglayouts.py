"""MIG layouts the server asks of this node (``SyncReply.mig``, set by operators with
``gpufleet node mig``), applied by the agent.

A ``MigChange`` is applied once, by a worker thread (NVML takes seconds per instance;
the agent's loop goes on meanwhile), when no local attempt holds that GPU (else at a
later sync); its result (error None: applied) travels with every sync (``mig_results``)
until the server no longer asks for that change, and is then forgotten. A layout
already applied (or failed) is never applied again while the server asks for it; a
different layout for the GPU is. See ``MigLayouts.step``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from gpufleet.agent.probe import GpuProbe, MigInstance, NodeInventory, ProbeError
from gpufleet.api.nodes import MigChange

log = logging.getLogger("gpufleet.agent")
Layout = tuple[str, ...]

NO_MIG_PROBE = "this node's GPU probe cannot change MIG layouts"
MIG_ERROR_CHARS = 512
"""``MigResult.error``'s limit: a longer message is cut, never the sync refused."""


@runtime_checkable
class MigProbe(Protocol):
    """A probe that can replace a GPU's MIG instances (``NvmlProbe``, ``SimulatedProbe``).
    A probe may also offer ``set_mig_mode(gpu_index, enabled)``; the agent uses it where
    present (see ``MigLayouts.apply_one``)."""

    def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]: ...


class MigLayouts:
    """The MIG changes under way and done on one node. ``lock`` is the agent's: ``step``
    and ``report`` are called with it held, and the worker takes it to record a result.
    ``inventory`` reads the agent's current inventory; ``applied(inventory)`` is called,
    the lock held, after each change with the inventory read afresh (None where it could
    not be read): the agent keeps it and syncs soon."""

    def __init__(
        self,
        *,
        node: str,
        lock: threading.Lock,
        inventory: Callable[[], NodeInventory],
        applied: Callable[[NodeInventory | None], None],
    ) -> None:
        self.node = node
        self._lock = lock
        self._inventory = inventory
        self._applied = applied
        self._results: dict[int, tuple[Layout, str | None]] = {}
        """GPU -> (layout, error) of a MIG change done, reported until the server stops asking."""
        self._applying: dict[int, Layout] = {}
        """GPU -> layout the MIG worker is applying now."""
        self._worker: threading.Thread | None = None

    def step(self, changes: Sequence[MigChange], *, probe: GpuProbe, busy: set[int]) -> bool:
        """Act on the reply's MIG changes (caller holds the lock): forget the results the
        server no longer asks for, then hand the changes not yet done, on GPUs not in
        ``busy`` (held by a local attempt), to a worker thread. One worker at a time: a
        change that arrives while it runs waits for the next sync (the worker's end
        triggers one). True when results are new at once (a probe that cannot change
        MIG layouts): news for the next sync.

        Never twice: a change with a result (applied or failed) is not applied again while
        the server asks for it. Results live in memory: an agent restarted before it
        reported one applies that layout once more (no job is on the GPU then)."""
        wanted: dict[int, Layout] = {c.gpu: tuple(c.layout) for c in changes}
        for gpu, (layout, _) in list(self._results.items()):
            if wanted.get(gpu) != layout:
                del self._results[gpu]
        todo = [
            (gpu, layout)
            for gpu, layout in sorted(wanted.items())
            if gpu not in self._applying
            and self._results.get(gpu, (None, None))[0] != layout
            and gpu not in busy
        ]
        if not todo or self._applying:
            return False
        if not isinstance(probe, MigProbe):
            for gpu, layout in todo:
                self._results[gpu] = (layout, NO_MIG_PROBE)
            return True
        self._applying = dict(todo)
        self._worker = threading.Thread(
            target=self._apply, args=(probe, todo), name=f"gpufleet-mig-{self.node}", daemon=True
        )
        self._worker.start()
        return False

    def report(self) -> list[dict[str, Any]]:
        """The results to send with a sync, as ``MigResult`` s (caller holds the lock)."""
        return [
            {"gpu": gpu, "layout": list(layout), "error": error}
            for gpu, (layout, error) in sorted(self._results.items())
        ]

    def _apply(self, probe: GpuProbe, todo: Sequence[tuple[int, Layout]]) -> None:
        """The MIG worker: apply each change, re-read the inventory (a failed change may
        have done part of its work: the next sync shows what the GPU holds), record the
        result and sync soon. Any exception is the change's error, never the worker's end."""
        for gpu, layout in todo:
            try:
                error = self.apply_one(probe, gpu, layout)
            except ProbeError as exc:
                error = str(exc) or type(exc).__name__
            except Exception as exc:
                log.exception("node %s: MIG layout for GPU %d failed", self.node, gpu)
                error = f"{type(exc).__name__}: {exc}"
            inventory: NodeInventory | None = None
            try:
                inventory = probe.inventory()
            except Exception as exc:
                log.warning("node %s: inventory after a MIG change: %s", self.node, exc)
            if error is not None:
                log.warning("node %s: MIG layout %s on GPU %d: %s", self.node, ",".join(layout), gpu, error)
            with self._lock:
                self._applying.pop(gpu, None)
                self._results[gpu] = (layout, None if error is None else error[:MIG_ERROR_CHARS])
                self._applied(inventory)

    def apply_one(self, probe: GpuProbe, gpu: int, layout: Layout) -> str | None:
        """One change: None once applied, else why not (``MigError``s propagate).

        A layout: ``apply_mig_layout`` (which refuses a GPU in MIG mode off; a probe with
        ``set_mig_mode`` turns it on first). The whole GPU (``[]``): a GPU whose MIG mode is
        off (or not reported) is whole already; else its instances are removed and, with
        ``set_mig_mode``, MIG mode is turned off. Without it that is an error telling the
        operator what is left to do (NVML turns MIG mode off only across a GPU reset, and
        a GPU in MIG mode with no instance is no whole GPU to CUDA)."""
        if not isinstance(probe, MigProbe):
            return NO_MIG_PROBE
        set_mode = getattr(probe, "set_mig_mode", None)
        info = next((g for g in self._inventory().gpus if g.index == gpu), None)
        mig_on = info is not None and bool(info.mig_enabled)
        if layout:
            if set_mode is not None and info is not None and not mig_on:
                set_mode(gpu, True)
            probe.apply_mig_layout(gpu, list(layout))
            return None
        if info is not None and not mig_on:
            return None
        probe.apply_mig_layout(gpu, [])
        if set_mode is not None:
            set_mode(gpu, False)
            return None
        return (
            f"GPU {gpu}: MIG instances removed, but MIG mode is still on and this node's probe cannot "
            f"turn it off: run nvidia-smi -i {gpu} -mig 0 (needs a GPU reset)"
        )

    def settle(self, timeout_s: float = 10.0) -> bool:
        """Wait until no MIG change is being applied; True if none is (tests, shutdown)."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout_s)
        return not self._applying
