"""What a simulation is given and what it returns: the made-up fleet (``FleetSpec``),
the knobs (``SimConfig``), each job's outcome and the run's result (``SimResult``,
with its summary metrics). The engine that produces them is ``engine.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufleet.scheduler import Fleet, Gpu, Hold, Node, Quota
from gpufleet.scheduler.powermodel import PowerModel
from gpufleet.sim.estimates import Actual, estimate_accuracy
from gpufleet.sim.shares import share_gpus

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
    shared_gpus: int = 0
    """GPUs shared (the fleet's last ones, ``shares.share_gpus``): fractional jobs get
    shares of them; 0: none, a fractional job takes a whole GPU."""

    def build(self) -> Fleet:
        per_domain = max(1, self.gpus_per_node // max(1, self.nvlink_domains))
        gpus = tuple(
            Gpu(index=i, model=self.gpu_model, nvlink_domain=i // per_domain)
            for i in range(self.gpus_per_node)
        )
        fleet = Fleet(
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
        return share_gpus(fleet, self.shared_gpus) if self.shared_gpus else fleet

    def describe(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpus": self.nodes * self.gpus_per_node,
            "nodes_per_leaf": self.nodes_per_leaf,
            "gpu_model": self.gpu_model,
            "shared_gpus": self.shared_gpus,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    restart_overhead_s: float = 60.0
    sched_interval_s: float = 0.1
    """A change is acted on (a pass, and its starts on the nodes) at the next multiple
    of this. The server wakes its pass on every submit and exit (passes at least 50 ms
    apart in a storm) and pushes the starts to the agents (``server/store/dispatch.py``):
    submit to running is ~0.1 s (``bench/bench_dispatch.py``). 10 s models a cluster
    whose nodes poll."""
    preempt_interval_s: float = 300.0
    checkpoint_interval_s: float = 1800.0
    """Jobs that declare no interval (``TraceJob.checkpoint_s``) checkpoint this often (seconds
    of work from each start); a preempted or failed job loses the work since its last one.
    0: nothing is lost (the simulator's old graceful preemption, for comparison)."""
    estimate_starts: bool = False
    """Keep each job's estimated start at its first pass (``SimResult.first_estimates``): the
    passes that see a new job then run with ``explain=True``, as a server's always do (the
    decisions are the same; the replay is slower). ``gpufleet simulate`` turns it on."""
    predict: bool = True
    """Predict each job's run time when a pass first sees it, from the jobs that ended
    before (``scheduler/predict.py``), and hand it to the core (``JobRequest.predicted_s``),
    as the server does (``gpufleet simulate --no-predict``: off, for comparison)."""
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
    power: PowerModel | None = None
    """Racks' power budgets, in every snapshot (``scheduler/power.py``); the simulator has
    no readings, so every busy GPU counts at its board power."""


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
    """GPU and node failures injected (``gpu_failures`` + ``node_failures``)."""
    busy_gpu_s: float
    """GPU-seconds occupied (a shared GPU counts whole while any unit of it is held)."""
    fleet_gpus: int
    fragmentation: float
    wall_s: float
    passes: int
    timeline: dict[str, list[float]] = field(default_factory=dict)
    shared_gpus: int = 0
    allocated_gpu_s: float = 0.0
    """GPU-seconds allocated: whole GPUs, and a share's units at 1 / SHARE_UNITS each."""
    free_gpu_s: float = 0.0
    """GPU-seconds in service and not allocated, first submit to the end of the run."""
    stranded_gpu_s: float = 0.0
    """The part of ``free_gpu_s`` on shared GPUs that were partly held."""
    first_failure: tuple[float, float] | None = None
    """(time, unallocated share of the fleet's GPUs) after the first pass that left a newly
    arrived job waiting; None if every job started in the pass after it arrived."""
    gpu_failures: int = 0
    node_failures: int = 0
    jobs_hit_by_failures: int = 0
    """Running attempts stopped by an injected failure."""
    lost_gpu_s: dict[str, float] = field(default_factory=dict)
    """GPU-seconds of work lost since the victims' last checkpoints, by cause
    (``preemption``, ``failure``)."""
    first_estimates: dict[str, float | None] | None = None
    """Job -> the estimated start of the first pass that saw it (jobs that waited past it);
    None when the run did not estimate (``SimConfig.estimate_starts``)."""

    def makespan(self) -> float:
        """First submit to last finish of the jobs that finished."""
        start = min((o.submit_s for o in self.outcomes), default=0.0)
        end = max((o.finish_s for o in self.outcomes), default=0.0)
        return max(0.0, end - start)

    def metrics(self) -> dict[str, float]:
        jct = np.array([o.jct_s for o in self.outcomes]) if self.outcomes else np.zeros(1)
        queue = np.array([o.queue_s for o in self.outcomes]) if self.outcomes else np.zeros(1)
        makespan = self.makespan()
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

    def costs(self) -> dict[str, float]:
        """What preemptions and failures cost: GPU-hours of work lost since checkpoints by
        cause, and the failures injected (GPU, node) and the attempts they stopped."""
        lost = self.lost_gpu_s
        return {
            "preemptions": float(self.preemptions),
            "lost_gpu_h_preemption": lost.get("preemption", 0.0) / 3600.0,
            "lost_gpu_h_failure": lost.get("failure", 0.0) / 3600.0,
            "gpu_failures": float(self.gpu_failures),
            "node_failures": float(self.node_failures),
            "jobs_hit_by_failures": float(self.jobs_hit_by_failures),
        }

    def estimates(self) -> dict[str, float | None] | None:
        """How close the first estimated starts came to the real first starts
        (``estimates.estimate_accuracy``); None when the run did not estimate."""
        if self.first_estimates is None:
            return None
        actual = {o.job_id: Actual(submit_s=o.submit_s, start_s=o.first_start_s) for o in self.outcomes}
        return estimate_accuracy(self.first_estimates, actual)

    def capacity(self) -> dict[str, float | None]:
        """What the run allocated of the fleet's GPU capacity (``sim/shares.py``):

        - ``allocated_share``: GPU-hours allocated (a share's units at 1 / SHARE_UNITS of
          a GPU each) / the fleet's GPU-hours over the makespan: ``utilization``'s window.
          Equal to ``utilization`` when no GPU is shared.
        - ``shared_fragmentation``: of the free GPU-hours (GPUs in service, not
          allocated; first submit to the end of the run), the share that lay on shared
          GPUs partly held: units too few for a bigger share and never usable whole.
          None when the fleet has no shared GPU.
        - ``unallocated_at_first_failure`` (FGD's measure, Weng et al., ATC'23): the share
          of the fleet's GPUs not allocated right after the first scheduling pass that
          left a job waiting that had arrived and never run (not held, not waiting for a
          dependency; a preempted or requeued job does not count) - what the fleet still
          had free when it first could not place a new job; ``first_failure_s`` is when
          (trace time). Both None when every job started in the pass after it arrived:
          under a preemptive policy (las) a new job that starts by preempting another
          was placed, so the figure may be None although preempted jobs waited.
        """
        makespan = self.makespan()
        fleet_s = self.fleet_gpus * makespan
        frag: float | None = None
        if self.shared_gpus:
            frag = self.stranded_gpu_s / self.free_gpu_s if self.free_gpu_s > 0 else 0.0
        failed = self.first_failure
        return {
            "allocated_share": self.allocated_gpu_s / fleet_s if fleet_s > 0 else 0.0,
            "shared_fragmentation": frag,
            "unallocated_at_first_failure": None if failed is None else failed[1],
            "first_failure_s": None if failed is None else failed[0],
        }
