"""Nodes and GPUs as the scheduler core sees them (``gpufleet.scheduler.Fleet``).

Two views: ``registered`` (every node of a pool as if all were up: the capacity a job
could ever get, used to reject impossible jobs at submit) and ``live_fleet`` (what may
take new work now: Ready, not cordoned, healthy GPUs).

A node whose rows the core's model refuses (``scheduler.Node``: several GPU models,
an index twice) is left out of both views, never allowed to fail the whole fleet: the
API keeps such rows from being written (``nodes.judge_inventory``), but rows written
by hand or by an older server must not stop every scheduling pass. Its jobs keep
running; it takes nothing new until its rows are repaired. ``LiveFleet.skipped`` says
which (``gpufleet_scheduler_skipped_nodes``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import false, func, select
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.cudaver import parse_reported
from gpufleet.scheduler import Fleet, Gpu, Node, shared_gpu_node
from gpufleet.scheduler.capacity import FleetIndex
from gpufleet.server.store.models import GpuRow, NodeRow

NodeKey = tuple[tuple[object, ...], ...]
log = logging.getLogger("gpufleet.scheduling")


def _rows(s: Session, pool: str | None) -> tuple[NodeKey, NodeKey]:
    """Plain tuples (no ORM objects: this runs on every scheduling pass)."""
    q = select(
        NodeRow.name,
        NodeRow.pool,
        NodeRow.leaf,
        NodeRow.rack,
        NodeRow.cordoned,
        NodeRow.last_seen,
        NodeRow.cpus,
        NodeRow.memory_mb,
        NodeRow.cuda_version,
        NodeRow.features,
        NodeRow.labels,
    ).order_by(NodeRow.name)
    gq = select(
        GpuRow.node,
        GpuRow.index,
        GpuRow.model,
        GpuRow.memory_mb,
        GpuRow.nvlink_domain,
        GpuRow.healthy & ~GpuRow.cordoned,  # the agent's verdict and the server's cordon
        func.coalesce(GpuRow.mig_enabled, false()),
        GpuRow.mig_instances,
        GpuRow.shared,
    ).order_by(GpuRow.node, GpuRow.index)
    if pool is not None:
        q = q.where(NodeRow.pool == pool)
        gq = gq.join(NodeRow, NodeRow.name == GpuRow.node).where(NodeRow.pool == pool)
    nodes = tuple((*r[:-2], frozenset([*(r[-2] or ()), *(r[-1] or ())])) for r in s.execute(q))  # hashable
    return nodes, tuple(tuple(r) for r in s.execute(gq))


def _build(nodes: NodeKey, gpus: NodeKey, *, live_since: float | None) -> tuple[Fleet, dict[str, str]]:
    """The fleet, and the nodes left out of it with the reason (the core's own model
    validation decides: whatever ``Node`` refuses is skipped, so a rule added there is
    honoured here)."""
    per: dict[object, list[Gpu]] = {}
    slices: dict[object, dict[str, list[Gpu]]] = {}
    shares: dict[object, set[int]] = {}  # node -> its shared GPUs that may take work
    for node, index, model, memory_mb, domain, healthy, mig_on, instances, shared in gpus:
        ok = bool(healthy) or live_since is None
        shared = bool(shared) and not mig_on  # MIG mode wins: its slices are the devices
        per.setdefault(node, []).append(
            Gpu(
                index=int(index),  # type: ignore[call-overload]
                model=str(model),
                memory_mb=int(memory_mb),  # type: ignore[call-overload]
                nvlink_domain=int(domain),  # type: ignore[call-overload]
                # a MIG or shared GPU is never handed out whole; as registered capacity (what
                # a job could ever get) it counts whole too: an operator may make it whole again
                healthy=ok and not ((mig_on or shared) and live_since is not None),
            )
        )
        if shared and ok:
            shares.setdefault(node, set()).add(int(index))  # type: ignore[call-overload]
        if mig_on:
            for m in instances or ():  # type: ignore[attr-defined]
                try:
                    g = Gpu(
                        index=mig.slice_index(int(index), int(m["start"])),  # type: ignore[call-overload]
                        model=mig.slice_model(str(model), str(m["profile"])),
                        memory_mb=int(m.get("memory_mb") or 0),
                        nvlink_domain=int(index),  # type: ignore[call-overload]
                        healthy=ok,
                    )
                except (AttributeError, KeyError, TypeError, ValueError):  # a row no agent sent
                    continue
                slices.setdefault(node, {}).setdefault(str(m["profile"]), []).append(g)
    out: list[Node] = []
    skipped: dict[str, str] = {}
    for name, pool, leaf, rack, cordoned, last_seen, cpus, memory_mb, cuda, features in nodes:
        live = live_since is None or (
            not cordoned and last_seen is not None and float(last_seen) >= live_since  # type: ignore[arg-type]
        )
        try:
            node = Node(
                name=str(name),
                gpus=tuple(per.get(name, ())),
                leaf=str(leaf),
                rack=str(rack),
                pool=str(pool),
                schedulable=live,
                cpus=int(cpus or 0),  # type: ignore[call-overload]
                mem_mb=int(memory_mb or 0),  # type: ignore[call-overload]
                features=features,  # type: ignore[arg-type]
                cuda=parse_reported(cuda if isinstance(cuda, str) else None),  # ``scheduler/cuda.py``
            )
            parts = [
                Node(
                    name=mig.slice_node(str(name), profile),
                    gpus=tuple(sorted(devices, key=lambda g: g.index)),
                    leaf=str(leaf),
                    rack=str(rack),
                    pool=str(pool),
                    schedulable=live,
                    features=features,  # type: ignore[arg-type]
                    cuda=node.cuda,
                )
                for profile, devices in sorted(slices.get(name, {}).items())
            ]
            shared = shares.get(name, set())
            parts += [shared_gpu_node(node, g) for g in node.gpus if g.index in shared]
        except ValueError as exc:  # one bad node never stops the fleet
            skipped[str(name)] = str(exc)
            continue
        out.append(node)
        out += parts
    return Fleet(nodes=tuple(out)), skipped


def slice_nodes(fleet: Fleet) -> dict[tuple[str, int], str]:
    """(node, slice index) -> the scheduler's node of that slice (``gpufleet.mig``); a
    shared GPU's units are found by ``mig.share_node`` alone."""
    return {
        (mig.physical_node(n.name), g.index): n.name
        for n in fleet.nodes
        if ":" in n.name and n.gpus and mig.is_slice_model(n.gpus[0].model)
        for g in n.gpus
    }


@dataclass(slots=True)
class LiveFleet:
    """The scheduling loop's fleet. The same ``Fleet`` object is returned while nothing
    in it changed, so the index this loop's ``PlanCache`` keeps of it stays valid."""

    _key: tuple[object, ...] | None = None
    _fleet: Fleet | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    """Nodes left out of the last fleet (invalid rows), with the reason."""
    slices: dict[tuple[str, int], str] = field(default_factory=dict)
    """``slice_nodes`` of the last fleet: where an allocation of a MIG slice is, to the core."""
    quiet: bool = False
    """Log nothing: a reader built afresh for each request (``racks.py``: the page and
    ``/metrics``) would repeat the scheduling loop's warning on every scrape."""

    def load(self, s: Session, *, live_since: float) -> Fleet:
        nodes, gpus = _rows(s, None)
        ready = tuple(
            not n[4] and n[5] is not None and float(n[5]) >= live_since  # type: ignore[arg-type]
            for n in nodes
        )
        key = (tuple(n[:5] + n[6:] for n in nodes), gpus, ready)  # not last_seen: `ready` has it
        if key != self._key or self._fleet is None:
            self._fleet, skipped = _build(nodes, gpus, live_since=live_since)
            if not self.quiet and skipped.keys() != self.skipped.keys():  # logged when the set changes
                for name, why in sorted(skipped.items()):
                    log.warning("node %s left out of scheduling: %s", name, why)
            self.skipped = skipped
            self.slices = slice_nodes(self._fleet)
            self._key = key
        return self._fleet


@dataclass(slots=True)
class FleetCache:
    """Per-pool registered fleets, fresh for ``ttl_s`` seconds or until ``invalidate``
    (called by every node write in this process). Submit checks read it on every request.

    A fleet loaded less than ``stale_s`` ago is kept after it goes stale:
    ``registered(..., stale_ok=True)`` returns it. Submissions accept a job that fits it
    and reload only to confirm a refusal (``is_fresh``): while a thousand nodes register,
    each invalidating the cache, job submissions would otherwise reload thousands of GPU
    rows inside the group commit for every batch."""

    ttl_s: float = 2.0
    stale_s: float = 10.0
    _cache: dict[str, tuple[float, float, Fleet]] = field(default_factory=dict)
    """pool -> (fresh until, loaded at, fleet)"""
    _indexes: dict[str, tuple[Fleet, FleetIndex]] = field(default_factory=dict)
    """pool -> its fleet's static index (``index``), while that fleet is the cached one"""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def registered(self, s: Session, pool: str, *, stale_ok: bool = False) -> Fleet:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(pool)
        if hit is not None and (hit[0] > now or (stale_ok and now - hit[1] < self.stale_s)):
            return hit[2]
        fleet, _ = _build(*_rows(s, pool), live_since=None)
        with self._lock:
            self._cache[pool] = (now + self.ttl_s, now, fleet)
        return fleet

    def index(self, pool: str, fleet: Fleet) -> FleetIndex:
        """The core's static index of ``fleet`` (a fleet this cache returned for
        ``pool``), built once per loaded fleet: a submit check reads only its fixed
        facts (``job_options``), so threads share it."""
        with self._lock:
            hit = self._indexes.get(pool)
        if hit is not None and hit[0] is fleet:
            return hit[1]
        index = FleetIndex(fleet)
        with self._lock:
            self._indexes[pool] = (fleet, index)
        return index

    def is_fresh(self, pool: str, fleet: Fleet) -> bool:
        with self._lock:
            hit = self._cache.get(pool)
        return hit is not None and hit[2] is fleet and hit[0] > time.monotonic()

    def invalidate(self) -> None:
        with self._lock:
            self._cache = {pool: (0.0, at, fleet) for pool, (_, at, fleet) in self._cache.items()}
