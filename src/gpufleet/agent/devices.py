"""What a job's GPU indices name on this node. The server allocates indices
(``gpufleet.mig``: whole GPUs, MIG slices, units of a GPU share); a job is started on
devices: a MIG slice is the ``MIG-...`` UUID of the instance the inventory shows at its
GPU and memory slice, a share its GPU and its part of the GPU's memory."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpufleet import mig
from gpufleet.agent.probe import NodeInventory

log = logging.getLogger("gpufleet.agent")


def job_devices(inventory: NodeInventory, gpus: Sequence[int], *, node: str) -> tuple[str, ...] | None:
    """``JobSpec.devices`` for these indices: () for whole GPUs; for MIG slices their
    ``MIG-...`` UUIDs from the inventory (the GPU and first memory slice an index
    names), None when one is not there (the layout changed under the allocation)."""
    if all(mig.slice_of(i) is None and mig.share_of(i) is None for i in gpus):
        return ()
    out: list[str] = []
    for i in gpus:
        share = mig.share_of(i)
        if share is not None:  # a GPU share: its GPU, once
            if str(share[0]) not in out:
                out.append(str(share[0]))
            continue
        where = mig.slice_of(i)
        if where is None:
            out.append(str(i))
            continue
        info = next((g for g in inventory.gpus if g.index == where[0]), None)
        found = None if info is None else next((m for m in info.mig_instances if m.start == where[1]), None)
        if found is None:
            log.warning("node %s: no MIG instance at GPU %d slice %d", node, *where)
            return None
        out.append(found.uuid)
    return tuple(out)


def job_share(inventory: NodeInventory, gpus: Sequence[int]) -> tuple[int, int] | None:
    """``JobSpec.share`` for these indices: (percent, MiB) of a GPU share's units, the
    memory the units' share of the GPU's (None: not a share)."""
    units = [s for s in map(mig.share_of, gpus) if s is not None]
    if not units:
        return None
    info = next((g for g in inventory.gpus if g.index == units[0][0]), None)
    memory = 0 if info is None else info.memory_mb
    return len(units), memory * len(units) // mig.SHARE_UNITS
