"""The scheduler's vocabulary: an immutable snapshot in, a Plan out.

Everything here is a frozen, keyword-only dataclass. The server builds a Snapshot from
SQL, the simulator from its virtual world; neither may hand the core anything mutable.
Times are seconds (floats) on whatever clock the caller uses: the core never reads one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpufleet.migindex import SHARE_UNITS, share_index, share_model, share_node, wants_share
from gpufleet.scheduler.powermodel import PowerModel


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One GPU of a node. ``nvlink_domain`` groups GPUs joined by NVLink/NVSwitch."""

    index: int
    model: str
    memory_mb: int = 81_920
    healthy: bool = True
    nvlink_domain: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A server. All its GPUs are of one model (as in real servers); a node with no
    GPUs is a CPU-only node: it runs only 0-GPU jobs (see cpu.py).

    ``schedulable`` is False when the node is cordoned, draining or not ready: its
    running jobs stay, but nothing new lands on it.
    """

    name: str
    gpus: tuple[Gpu, ...]
    leaf: str = "leaf-0"
    rack: str = "rack-0"
    pool: str = "default"
    schedulable: bool = True
    cpus: int = 0
    """CPUs jobs may hold here (0: not tracked, no limit); likewise ``mem_mb``, MiB."""
    mem_mb: int = 0
    features: frozenset[str] = frozenset()
    """Slurm's node features (its agent's and operators' labels), for ``--constraint``."""
    cuda: tuple[int, int] | None = None
    """The newest CUDA its driver supports (None: not reported); ``cuda.py``."""

    def __post_init__(self) -> None:
        models = {g.model for g in self.gpus}
        if len(models) > 1:
            raise ValueError(f"node {self.name} mixes GPU models {sorted(models)}")
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"node {self.name} has duplicate GPU indices")

    @property
    def model(self) -> str:
        return self.gpus[0].model if self.gpus else ""


def shared_gpu_node(node: Node, gpu: Gpu) -> Node:
    """The core's node of ``node``'s shared GPU ``gpu``: its ``SHARE_UNITS`` units
    (``gpufleet.migindex``), as the server's inventory and the simulator build it."""
    return Node(
        name=share_node(node.name, gpu.index),
        gpus=tuple(
            Gpu(
                index=share_index(gpu.index, u),
                model=share_model(gpu.model),
                memory_mb=gpu.memory_mb,  # the GPU's: a share is sized by units
                nvlink_domain=gpu.index,
            )
            for u in range(SHARE_UNITS)
        ),
        leaf=node.leaf,
        rack=node.rack,
        pool=node.pool,
        schedulable=node.schedulable,
        features=node.features,
        cuda=node.cuda,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """All nodes, in a stable order (the order breaks placement ties)."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocked:
    """Why a job may not start yet, whatever the fleet holds: ``code`` is Slurm's reason
    (``Dependency``, ``DependencyNeverSatisfied``), ``detail`` the words after it.
    ``after``: the jobs it waits for; its estimated start is the latest of their
    estimated ends (none known: no estimate) and ``not_before``. ``never``: it can
    never start."""

    code: str
    detail: str
    after: tuple[str, ...] = ()
    never: bool = False
    not_before: float | None = None
    """It may start at this time at the earliest (``--begin``, a price window)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequest:
    """A job as the scheduler sees it.

    Shape: ``gpus`` in total; ``gpus_per_node`` or ``nodes`` pin the split (0 = the
    scheduler decides: one node when it fits, else whole nodes, fewest first).
    ``attained_service_s`` is GPU-seconds received *before* the current run (for a
    running job the core adds the time since ``RunningJob.started_at``);
    ``executed_s`` likewise in wall seconds. ``pending_since`` is when the job last
    entered the queue (submit, or its last preemption/requeue).
    ``reservation`` names a reservation the job must run in (Slurm's ``--reservation``);
    jobs of a reservation's users or team use it automatically while it is active.
    ``oracle_remaining_s`` is known only inside the simulator and only the
    ``srtf-oracle`` reference policy may read it.
    ``spread`` groups jobs to keep apart (the replicas of one inference service): a
    one-node job of a group goes to a node holding none of the group, under a leaf
    switch holding none if there is one, and only when every fitting node holds one
    does it share (Kubernetes' preferred pod anti-affinity, then topology spread).
    ``array`` names the job array a task belongs to; ``array_limit`` (Slurm's ``%N``)
    is how many of its tasks may run at once (0: no limit): the core starts no more.
    ``blocked``: the job may not start yet whatever the fleet holds (an unmet
    dependency, ``deps.py``); it waits outside the queue.
    """

    id: str
    gpus: int
    submit_time: float
    user: str = ""
    team: str = ""
    priority: int = 0
    gpus_per_node: int = 0
    nodes: int = 0
    gpu_type: str | None = None
    pool: str = "default"
    time_limit_s: float | None = None
    attained_service_s: float = 0.0
    executed_s: float = 0.0
    pending_since: float | None = None
    preemptible: bool = True
    reservation: str | None = None
    oracle_remaining_s: float | None = None
    spread: str | None = None
    array: str | None = None
    array_limit: int = 0
    blocked: Blocked | None = None
    cpus: int = 0
    """CPUs it holds on each of its nodes (0: none asked); likewise ``mem_mb``, MiB."""
    mem_mb: int = 0
    constraint: str | None = None
    """``--constraint`` over node features, canonical (``features.py``); None: any node."""
    exclude: frozenset[str] = frozenset()
    """``--exclude``: nodes it never runs on."""
    qos: str | None = None
    """Its QOS (``--qos``), whose per-user limits the core enforces (``qos.py``)."""
    licenses: tuple[tuple[str, int], ...] = ()
    """``-L``: (license, count) it holds while it runs (``licenses.py``)."""
    cuda: tuple[int, int] | None = None
    """``--cuda``: the CUDA version it needs; only nodes whose driver supports it (``cuda.py``)."""
    checkpoint_s: float | None = None
    """``--checkpoint-every``: how often it saves its state (seconds; None: not declared).
    A running job stopped now loses the work since its last checkpoint (``victims.lost_work``)."""
    predicted_s: float | None = None
    """Its predicted total run time, wall seconds, from the history of jobs like it
    (``predict.py``; None: no prediction). Policies may read it; only ``srtf-oracle``
    reads ``oracle_remaining_s``."""
    predicted_confidence: float = 0.0
    """0..1: how far ``predicted_s`` is to be trusted (``predict.Prediction``)."""

    @property
    def units(self) -> int:
        """How many of its devices make one GPU: 1 (whole GPUs, and MIG slices, which count
        as GPUs), or ``migindex.SHARE_UNITS`` for a GPU share (``gpus`` is then its units)."""
        return SHARE_UNITS if self.gpu_type is not None and wants_share(self.gpu_type) else 1

    @property
    def gpu_weight(self) -> float:
        """GPUs it counts as in quotas, fair share and attained service."""
        if self.gpu_type is None:
            return self.gpus
        return self.gpus / self.units

    @property
    def queued_since(self) -> float:
        return self.submit_time if self.pending_since is None else self.pending_since


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGpus:
    """The GPUs a job holds on one node."""

    node: str
    gpus: tuple[int, ...]


Placement = tuple[NodeGpus, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningJob:
    job: JobRequest
    placement: Placement
    started_at: float

    def attained_service_s(self, now: float) -> float:
        return self.job.attained_service_s + self.job.gpu_weight * max(0.0, now - self.started_at)

    def executed_s(self, now: float) -> float:
        return self.job.executed_s + max(0.0, now - self.started_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """A team's share. ``gpus`` is the nominal (guaranteed) amount and the weight for
    fair share; ``limit`` is a hard cap (None: the team may borrow idle GPUs)."""

    team: str
    gpus: int
    limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class QosLimit:
    """A QOS's per-user limits (Slurm's ``MaxTRESPerUser=gres/gpu``, ``MaxJobsPerUser``;
    None: no limit). Its priority and preemptability are in each job's request."""

    name: str
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """GPUs booked on named nodes for the window ``[start, end)``.

    ``nodes`` holds (node name, GPU count) pairs. Owners are the jobs that name the
    reservation and, automatically, jobs of ``users`` or ``team``. A ``maintenance``
    reservation owns no jobs: its GPUs are simply kept empty for the window.
    """

    id: str
    start: float
    end: float
    nodes: tuple[tuple[str, int], ...]
    users: tuple[str, ...] = ()
    team: str | None = None
    maintenance: bool = False

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"reservation {self.id}: end must be after start")

    @property
    def gpus(self) -> int:
        return sum(n for _, n in self.nodes)

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def owns(self, job: JobRequest) -> bool:
        if self.maintenance:
            return False
        if job.reservation is not None:
            return job.reservation == self.id
        return job.user in self.users or (self.team is not None and job.team == self.team)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold:
    """A team whose waiting jobs may not start (e.g. over its hard budget), and why.
    Its jobs stay pending with ``reason`` as their reason, without a queue position or
    an estimated start; they reserve nothing and keep no one else waiting. Jobs of the
    team that already run are not touched."""

    team: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Everything one pass may look at. ``pending`` holds GPU jobs and 0-GPU jobs alike
    (the core places both); ``running`` likewise (0-GPU jobs with a placement of
    ``NodeGpus(node=..., gpus=())``: they count toward their node's job count)."""

    now: float
    fleet: Fleet
    running: tuple[RunningJob, ...] = ()
    pending: tuple[JobRequest, ...] = ()
    quotas: tuple[Quota, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    holds: tuple[Hold, ...] = ()
    qos: tuple[QosLimit, ...] = ()
    licenses: tuple[tuple[str, int], ...] = ()
    """(license, count) the operator declared (``gpufleet admin license set``)."""
    power: PowerModel | None = None
    """Racks' power budgets and how draw is estimated (``power.py``); None: no budgets."""


class Status(enum.Enum):
    """Why a job did not start, in the Kubernetes scheduler framework's terms."""

    UNSCHEDULABLE = "Unschedulable"  # may start later, when something changes
    UNRESOLVABLE = "UnschedulableAndUnresolvable"  # can never run on this fleet as asked


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    job_id: str
    placement: Placement


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemption:
    job_id: str
    by: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingStatus:
    """A waiting job's place in line. ``reason`` starts with a Slurm-style code
    (Resources, Priority, QuotaLimit, Unschedulable) followed by the detail, except for
    a held job, whose reason is the ``Hold``'s as given. ``position`` is None for jobs
    outside the GPU queue: held jobs and 0-GPU jobs that found no node."""

    job_id: str
    position: int | None
    estimated_start: float | None
    status: Status
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationMove:
    """GPUs of an active reservation moved off a node where non-preemptible jobs hold
    them, onto free GPUs of another node of the same group."""

    reservation: str
    from_node: str
    to_node: str
    gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    policy: str
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservation_moves: tuple[ReservationMove, ...] = ()
    pending: tuple[PendingStatus, ...] = ()
    fragmentation: float = 0.0
    free_gpus: int = 0
