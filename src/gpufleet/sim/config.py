"""What a simulation is given and what it returns: the made-up fleet (``FleetSpec``),
the knobs (``SimConfig``), each job's outcome and the run's result (``SimResult``,
with its summary metrics). The engine that produces them is ``engine.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufleet.scheduler import Fleet, Gpu, Hold, Node, Quota

NODES_PER_LEAF = 10
"""Servers under one leaf switch in a made-up fleet: ``gpufleet simulate``'s and
``gpufleet demo``'s default, so the two build the same topology."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSpec:
    nodes: int = 50
    gpus_per_node: int = 8
    nodes_per_leaf: int = NODES_PER_LEAF
    leaves_per_rack: int = 1
    gpu_model: str = "H100-80GB"
    nvlink_domains: int = 1

    def build(self) -> Fleet:
        per_domain = max(1, self.gpus_per_node // max(1, self.nvlink_domains))
        gpus = tuple(
            Gpu(index=i, model=self.gpu_model, nvlink_domain=i // per_domain)
            for i in range(self.gpus_per_node)
        )
        return Fleet(
            nodes=tuple(
                Node(
                    name=f"node-{i:04d}",
                    gpus=gpus,
                    leaf=f"leaf-{i // self.nodes_per_leaf:03d}",
                    rack=f"rack-{i // (self.nodes_per_leaf * self.leaves_per_rack):03d}",
                )
                for i in range(self.nodes)
            )
        )

    def describe(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpus": self.nodes * self.gpus_per_node,
            "nodes_per_leaf": self.nodes_per_leaf,
            "gpu_model": self.gpu_model,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    restart_overhead_s: float = 60.0
    sched_interval_s: float = 0.1
    """A change is acted on (a pass, and its starts on the nodes) at the next multiple
    of this. The server wakes its pass on every submit and exit (passes at least 50 ms
    apart in a storm) and pushes the starts to the agents (``server/dispatch.py``):
    submit to running is ~0.1 s (``bench/bench_dispatch.py``). 10 s models a cluster
    whose nodes poll."""
    preempt_interval_s: float = 300.0
    checkpoint_interval_s: float = 3600.0
    gpu_failures_per_gpu_day: float = 0.0
    node_failures_per_node_day: float = 0.0
    repair_s: float = 4 * 3600.0
    requeue_after_s: float = 0.0
    """A failed node's jobs re-enter the queue this long after the failure (the server's
    node timeout + requeue-after); a failed GPU's job at once (the GPU is cordoned)."""
    seed: int = 0
    sample_interval_s: float = 900.0
    quotas: tuple[Quota, ...] = ()
    """Team quotas, in every snapshot (fair share's weights; ``limit``: hard caps)."""
    holds: tuple[Hold, ...] = ()
    """Teams whose waiting jobs may not start (none unless configured). Their jobs stay
    pending to the end of the run and are not among the outcomes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOutcome:
    job_id: str
    submit_s: float
    first_start_s: float
    finish_s: float
    duration_s: float
    gpus: int
    queue_s: float
    preemptions: int
    failures: int
    timed_out: bool

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.submit_s


@dataclass(slots=True, kw_only=True)
class SimResult:
    policy: str
    outcomes: list[JobOutcome]
    rejected: list[tuple[str, str]]
    preemptions: int
    failures_injected: int
    busy_gpu_s: float
    fleet_gpus: int
    fragmentation: float
    wall_s: float
    passes: int
    timeline: dict[str, list[float]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        jct = np.array([o.jct_s for o in self.outcomes]) if self.outcomes else np.zeros(1)
        queue = np.array([o.queue_s for o in self.outcomes]) if self.outcomes else np.zeros(1)
        start = min((o.submit_s for o in self.outcomes), default=0.0)
        end = max((o.finish_s for o in self.outcomes), default=0.0)
        makespan = max(0.0, end - start)
        return {
            "avg_jct_s": float(jct.mean()),
            "p50_jct_s": float(np.percentile(jct, 50)),
            "p99_jct_s": float(np.percentile(jct, 99)),
            "avg_queue_s": float(queue.mean()),
            "p99_queue_s": float(np.percentile(queue, 99)),
            "makespan_s": makespan,
            "utilization": self.busy_gpu_s / (self.fleet_gpus * makespan) if makespan > 0 else 0.0,
            "fragmentation": self.fragmentation,
            "preemptions": float(self.preemptions),
            "sim_wall_s": self.wall_s,
        }
