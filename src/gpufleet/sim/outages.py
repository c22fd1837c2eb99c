"""Injected GPU and node failures: when the next one comes, what it hits, and the fleet
the scheduling passes see meanwhile (the failed GPUs unhealthy until repaired).

Failures are a seeded Poisson process per kind (``SimConfig.gpu_failures_per_gpu_day``,
``node_failures_per_node_day``) over the fleet's physical servers (``shares.physical_nodes``);
a failed shared GPU takes its share units down with it. The engine stops the jobs on what
was hit and schedules the repair.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpufleet.scheduler import Fleet
from gpufleet.sim.shares import CapacityMeter, physical_nodes, shared_nodes, unit_keys

GpuKey = tuple[str, int]
"""(node, GPU index), or a share unit's key (``shares.unit_keys``)."""


class Outages:
    """What is down now, counted per failure in force (a GPU hit twice stays down until
    both are repaired), and how many failures of each kind were injected."""

    def __init__(self, fleet: Fleet, meter: CapacityMeter, *, seed: int) -> None:
        self.healthy_fleet = fleet  # without outages: decides what can ever run
        self.servers = physical_nodes(fleet)  # failures hit these (and their shared GPUs)
        self.shared = shared_nodes(fleet)
        self.meter = meter
        self.rng = np.random.default_rng(seed)
        self.down: dict[GpuKey, int] = {}  # (node, gpu) -> outages in force
        self.injected = {"gpu": 0, "node": 0}

    def next_in(self, what: str, per_day: float) -> float:
        """Seconds to the next ``what`` failure ("gpu" or "node") at ``per_day`` per
        GPU-day or node-day."""
        units = self.meter.gpus if what == "gpu" else len(self.servers)
        rate = per_day * units / 86_400.0
        return float(self.rng.exponential(1.0 / rate))

    def hit(self, what: str) -> list[GpuKey]:
        """Draw what the next ``what`` failure takes down: one GPU of a random server, or
        all of one, and their share units; they are down from now (``fleet``)."""
        node = self.servers[int(self.rng.integers(len(self.servers)))]
        if what == "gpu":
            hit = [(node.name, int(self.rng.integers(len(node.gpus))))]
        else:
            hit = [(node.name, g.index) for g in node.gpus]
        hit += [k for name, g in hit for k in unit_keys(name, g, self.shared)]  # a shared GPU's units
        self.injected[what] += 1
        for k in hit:
            self.down[k] = self.down.get(k, 0) + 1
        return hit

    def repair(self, hit: list[GpuKey]) -> None:
        for k in hit:
            self.down[k] -= 1
            if not self.down[k]:
                del self.down[k]

    def fleet(self) -> Fleet:
        """The fleet as the passes see it now: GPUs down are unhealthy."""
        down = self.down
        self.meter.down = sum(1 for name, _ in down if name not in self.shared)
        return Fleet(
            nodes=tuple(
                replace(
                    n,
                    gpus=tuple(
                        replace(g, healthy=g.healthy and (n.name, g.index) not in down) for g in n.gpus
                    ),
                )
                if any((n.name, g.index) in down for g in n.gpus)
                else n
                for n in self.healthy_fleet.nodes
            )
        )
