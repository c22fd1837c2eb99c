"""GPU shares in the simulator: which GPUs of the made-up fleet are shared, how a
fractional job asks for a share, and what the run allocated of the fleet's capacity.

The fleet (``share_gpus``) is shown to the scheduling core exactly as the server's
inventory shows it (``server/services/inventory.py::_build``, ``gpufleet.migindex``): a
shared GPU stays on its node with ``healthy=False`` (never handed out whole) and becomes a
node of its own, ``share_node(node, gpu)``, right after its node, holding ``SHARE_UNITS``
units of model ``share_model(model)``. A trace job with ``gpu_milli`` < 1000 asks, as
``--gpu-fraction`` does on the server (``server/services/submitfit._share``), for
``ceil(gpu_milli x SHARE_UNITS / 1000)`` units of GPU type ``share_gpu_type(gpu_type)``
on one node (``request_shape``); the core places them (best fit: the fullest shared GPU
that fits). A fleet without shared GPUs gives a fractional job a whole GPU, as before.

Which GPUs are shared (``gpufleet simulate --shared-gpus``, ``shared_gpu_count``): the
LAST ones of the fleet in node order (the last node's GPUs first), so whole-GPU gangs
keep the first nodes whole:

- ``N``: that many GPUs (0: none; fractional jobs then take whole GPUs).
- ``all``: every GPU (whole-GPU jobs are then rejected: nothing can hold them).
- ``auto`` (the default): what the fractional jobs would hold at their peak if each ran
  from its submit (``fractional_peak_units``), in GPUs rounded up to whole nodes, at
  most the fleet less the widest whole-GPU job's GPUs and at least one GPU when any job
  is fractional. A trace without fractions gets none: it runs exactly as before.

The sim never turns a shared GPU whole again (an operator on a server may), so its
capacity checks (which jobs can never run) see the fleet as it is; the server's
registered view counts shared GPUs whole.

What the run allocated (``CapacityMeter``), in GPUs, at every instant: *allocated* is
the whole GPUs held plus held units / ``SHARE_UNITS``; *occupied* counts a shared GPU
whole while any unit of it is held (``util``); *stranded* is the free units of shared
GPUs that are partly held (some but not all units), / ``SHARE_UNITS``; *free* is the
GPUs in service (not failed) less *allocated*. ``SimResult.capacity`` turns their time
integrals into the report's figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpufleet.migindex import (
    SHARE_UNITS,
    physical_node,
    share_gpu_type,
    share_index,
    share_node,
)
from gpufleet.scheduler import Fleet, Node, Placement, shared_gpu_node
from gpufleet.sim.trace import TraceJob, is_fractional, share_units

SHARED_CHOICES = ("auto", "all")
"""``--shared-gpus``' words; anything else is a GPU count."""


def request_shape(job: TraceJob, *, shares: bool) -> tuple[int, int, int, str | None]:
    """``(gpus, gpus_per_node, nodes, gpu_type)`` of ``job``'s ``JobRequest``. With
    ``shares`` (the fleet has shared GPUs) a fractional job asks for its units on one
    node, of GPU type "SHARED" ("<model> SHARED" when it names a model), as the server
    shapes a ``--gpu-fraction`` job; otherwise the trace's shape (a fraction: a whole GPU)."""
    if shares and is_fractional(job):
        units = share_units(job.gpu_milli)
        return units, units, 1, share_gpu_type(job.gpu_type)
    return job.gpus, job.gpus_per_node, 0, job.gpu_type


def fractional_peak_units(jobs: Iterable[TraceJob]) -> int:
    """The most units the fractional jobs would hold at once if each ran from its submit for
    its duration (intervals ``[submit, submit + duration)``): what they need never to wait."""
    edges: list[tuple[float, int]] = []
    for j in jobs:
        if is_fractional(j):
            units = share_units(j.gpu_milli)
            edges += [(j.submit_s, units), (j.submit_s + j.duration_s, -units)]
    edges.sort()  # at one instant, ends (negative) before starts: intervals are half-open
    held = peak = 0
    for _, units in edges:
        held += units
        peak = max(peak, held)
    return peak


def shared_gpu_count(value: str, jobs: Sequence[TraceJob], *, nodes: int, gpus_per_node: int) -> int:
    """How many GPUs ``--shared-gpus VALUE`` shares on a fleet of ``nodes`` x
    ``gpus_per_node`` for ``jobs`` (the module docstring's rules); ``ValueError`` says why
    a value is not one."""
    total = nodes * gpus_per_node
    word = value.strip().lower()
    if word == "all":
        return total
    if word == "auto":
        peak = fractional_peak_units(jobs)
        if peak == 0:
            return 0
        wanted = math.ceil(math.ceil(peak / SHARE_UNITS) / gpus_per_node) * gpus_per_node
        widest = max((j.gpus for j in jobs if not is_fractional(j)), default=0)
        return max(1, min(wanted, total - widest))
    try:
        count = int(word)
    except ValueError:
        raise ValueError(f"{value!r}: expected a number of GPUs, {' or '.join(SHARED_CHOICES)}") from None
    if not 0 <= count <= total:
        raise ValueError(f"{count} shared GPUs: the fleet has {total} ({nodes} x {gpus_per_node})")
    return count


def share_gpus(fleet: Fleet, count: int) -> Fleet:
    """``fleet`` (whole GPUs only) with its last ``count`` GPUs shared, shown to the core as
    the server's inventory shows shared GPUs (module docstring)."""
    every = [(n.name, g.index) for n in fleet.nodes for g in n.gpus]
    chosen = set(every[len(every) - count :]) if count > 0 else set()
    out: list[Node] = []
    for node in fleet.nodes:
        mine = [g for g in node.gpus if (node.name, g.index) in chosen]
        if not mine:
            out.append(node)
            continue
        gpus = tuple(replace(g, healthy=False) if g in mine else g for g in node.gpus)
        out.append(replace(node, gpus=gpus))
        out += [shared_gpu_node(node, g) for g in mine]
    return Fleet(nodes=tuple(out))


def physical_nodes(fleet: Fleet) -> tuple[Node, ...]:
    """The servers of ``fleet``, without the nodes of their shared GPUs."""
    return tuple(n for n in fleet.nodes if physical_node(n.name) == n.name)


def shared_nodes(fleet: Fleet) -> frozenset[str]:
    """The names of ``fleet``'s shared-GPU nodes."""
    return frozenset(n.name for n in fleet.nodes if physical_node(n.name) != n.name)


def unit_keys(node: str, gpu: int, shared: frozenset[str]) -> list[tuple[str, int]]:
    """The (node, index) keys a failure of GPU ``gpu`` of ``node`` also takes down: every
    unit of it when it is shared, else none."""
    name = share_node(node, gpu)
    if name not in shared:
        return []
    return [(name, share_index(gpu, u)) for u in range(SHARE_UNITS)]


def _stranded(units: int) -> int:
    return SHARE_UNITS - units if 0 < units < SHARE_UNITS else 0


@dataclass(slots=True)
class CapacityMeter:
    """What the running jobs hold of the fleet now, and its time integrals (in GPU-seconds;
    module docstring for the terms). The engine calls ``hold`` at every start and release
    and ``advance`` at every step of its clock."""

    gpus: int
    """The fleet's GPUs (servers' GPUs; a shared GPU counts once)."""
    shared: frozenset[str]
    whole: int = 0
    units: int = 0
    stranded: int = 0
    down: int = 0
    """GPUs out of service (failed, not yet repaired)."""
    held: dict[str, int] = field(default_factory=dict)  # shared-GPU node -> units held
    allocated_gpu_s: float = 0.0
    free_gpu_s: float = 0.0
    stranded_gpu_s: float = 0.0

    @property
    def allocated(self) -> float:
        return self.whole + self.units / SHARE_UNITS

    def hold(self, placement: Placement, sign: int) -> int:
        """Take (``sign`` 1) or give back (-1) ``placement``; the change in GPUs occupied."""
        occupied = 0
        for part in placement:
            n = len(part.gpus) * sign
            if part.node not in self.shared:
                self.whole += n
                occupied += n
                continue
            before = self.held.get(part.node, 0)
            after = self.held[part.node] = before + n
            self.units += n
            self.stranded += _stranded(after) - _stranded(before)
            occupied += (after > 0) - (before > 0)
        return occupied

    def advance(self, dt: float) -> None:
        allocated = self.allocated
        self.allocated_gpu_s += allocated * dt
        self.free_gpu_s += (self.gpus - self.down - allocated) * dt
        self.stranded_gpu_s += self.stranded / SHARE_UNITS * dt

    def unallocated_share(self) -> float:
        """The share of the fleet's GPUs not allocated now (failed ones included)."""
        return 1.0 - self.allocated / self.gpus if self.gpus else 0.0
