"""The state of one scheduling pass, as one explicit object (Kubernetes' ``CycleState``).

``CycleState`` holds everything a pass reads and changes: the snapshot and policy it
runs for, free capacity and its reservation views, what it has started, preempted and
reserved so far, why jobs wait, and the memos that make the next job cheaper. The steps
of the pass (``core.py``: the per-job pipeline; ``filters.py``, ``placing.py``,
``preempt.py``, ``backfill.py``, ``explain.py``) are functions that receive it; nothing
else holds state, and nothing of it outlives the pass (what a caller reuses lives in its
``PlanCache``). ``new_cycle`` builds it from the snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from gpufleet.scheduler import sharing
from gpufleet.scheduler.cache import PlanCache
from gpufleet.scheduler.capacity import Capacity, FleetIndex, GroupKey
from gpufleet.scheduler.licenses import LicenseUsage
from gpufleet.scheduler.model import JobRequest, Preemption, Snapshot, Start, Status
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.policies import Policy
from gpufleet.scheduler.policies.base import Context, Key
from gpufleet.scheduler.power import RackLoad, rack_load
from gpufleet.scheduler.qos import QosUsage
from gpufleet.scheduler.release import Completions, GroupVictims
from gpufleet.scheduler.reservations import ReservationBook
from gpufleet.scheduler.resources import NodeResources
from gpufleet.scheduler.victims import Ranking, RunningKeys, Victim, caches_running_keys

__all__ = ["CycleState", "NoFitKey", "Shadow", "Wait", "new_cycle"]

_gpus_of = attrgetter("gpus")

NoFitKey = tuple[int, bool, int, int, str | None, frozenset[str], tuple[int, int] | None]
"""A waiting job's shape for ``CycleState.nofit``: (id of its options, long for
backfill, CPUs, memory, constraint, excluded nodes, CUDA needed)."""


@dataclass(slots=True)
class Wait:
    """Why a job waits: its status, Slurm-style reason code and detail, and the options
    it was tried in (None when it can never run; the explanation estimates from them)."""

    status: Status
    code: str
    detail: str = ""
    options: Options | None = None


@dataclass(slots=True)
class Shadow:
    """EASY backfill's reservation for the first blocked job. ``spare``: node -> GPUs
    free at ``time`` that the reserved job leaves over (what a long job may use now)."""

    job_id: str
    time: float
    spare: dict[int, int]


@dataclass(slots=True, kw_only=True)
class CycleState:
    """One pass's state. Built by ``new_cycle``; read and changed by the steps only."""

    # -- what the pass runs for (set once) ------------------------------------------
    snap: Snapshot
    policy: Policy
    explain: bool
    now: float
    held: list[tuple[JobRequest, str]]
    """Jobs of held teams, with the hold's reason (never considered)."""
    blocked: list[JobRequest]
    """Jobs whose dependency, begin time or price window does not hold yet."""
    cpu_pending: list[JobRequest]
    """0-GPU jobs, placed after the GPU jobs (``core.start_cpu_jobs``)."""
    gpu_pending: Sequence[JobRequest]
    """The queue proper: GPU jobs, in the snapshot's order."""
    index: FleetIndex

    # -- resources, changed as jobs start and are preempted ---------------------------
    cap: Capacity
    """Free GPUs per node and group (best fit reads its buckets)."""
    book: ReservationBook
    """Reservations and the views of capacity each job may use."""
    ctx: Context
    """What the policy sees (quotas, GPUs per team, kept current)."""
    res: NodeResources | None
    """Free CPUs and memory per node (None: no job asks for them)."""
    qos: QosUsage
    licenses: LicenseUsage
    power: RackLoad | None
    """Estimated draw of racks with a power budget (None: no budgets, ``power.py``)."""

    # -- decisions so far --------------------------------------------------------------
    starts: list[Start] = field(default_factory=list)
    started: dict[str, JobRequest] = field(default_factory=dict)
    """The GPU jobs of ``starts``, by id."""
    preemptions: list[Preemption] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)
    """Running jobs this pass decided to preempt."""
    waits: dict[str, Wait] = field(default_factory=dict)
    """Why each considered GPU job that did not start waits."""
    shadow: Shadow | None = None
    """EASY backfill's reservation for the first job that found no resources."""
    strict_blocker: str | None = None
    """Strict order (backfill "none"): the first job that found no resources."""
    masked: bool = False
    """The last placement hid nodes lacking CPUs or memory, or ruled out by constraints."""

    # -- memos of this pass --------------------------------------------------------------
    options_cache: dict[tuple[object, ...], Options | str] = field(default_factory=dict)
    """(gpus, per node, nodes, type, pool) -> the job's options, or why it has none."""
    nofit: dict[NoFitKey, Wait] = field(default_factory=dict)
    """Shapes that did not fit where free capacity only shrinks (see ``core.consider``)."""
    reasons: dict[int, str] = field(default_factory=dict)
    """id(options) -> "Resources: ..." (explain only)."""
    array_counts: dict[str, int] | None = None
    """Tasks running per array (built on first use)."""
    pool_nodes: dict[str, list[str]] = field(default_factory=dict)
    """Pool -> its node names (for CPUs and memory that never fit)."""
    newest_cuda: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    """Pool -> the newest CUDA a driver of its supports (``cuda.py``; built on first use)."""
    share_mix: sharing.Fragmentation | None = None
    """The waiting GPU shares' mix (built on first use)."""

    # -- preemption (preempt.py) -----------------------------------------------------------
    running_keys: RunningKeys | None = None
    """The caller's ranking of running jobs kept across passes (policies that allow it)."""
    keyed: Ranking | None = None
    """Running jobs any waiting job could preempt, by key (ranked on first need)."""
    worst_key: Key = ()
    victims: list[Victim] | None = None
    """Preemptible running jobs above the first floor asked, worst-ranked first."""
    victim_front: int = 0
    """Victims before this index were preempted earlier in the pass."""
    victim_totals: dict[GroupKey, list[int]] = field(default_factory=dict)
    """Running totals of the victims' GPUs per group, worst first."""
    group_victims: dict[GroupKey, GroupVictims] = field(default_factory=dict)
    completions: dict[tuple[GroupKey, int], Completions] = field(default_factory=dict)
    changed: list[int] = field(default_factory=list)
    """Nodes whose free count changed for good (for ``completions``)."""
    hopeless: dict[tuple[object, ...], Key] = field(default_factory=dict)
    """(group, shape, scope) -> the key of the last job no victims could place there."""


def new_cycle(snapshot: Snapshot, policy: Policy, explain: bool, cache: PlanCache | None) -> CycleState:
    """The state a pass over ``snapshot`` starts from (``cache``: the caller's, or None)."""
    held, blocked, cpu_pending, gpu_pending = _split_pending(snapshot)
    index = FleetIndex(snapshot.fleet) if cache is None else cache.index(snapshot.fleet)
    cap = Capacity.build(index, snapshot.running)
    running_keys: RunningKeys | None = None
    if policy.preemptive and caches_running_keys(policy) and cap.occupancy is not None:
        running_keys = index.policy_state(policy, RunningKeys)
        running_keys.observe(cap.occupancy)
    return CycleState(
        snap=snapshot,
        policy=policy,
        explain=explain,
        now=snapshot.now,
        held=held,
        blocked=blocked,
        cpu_pending=cpu_pending,
        gpu_pending=gpu_pending,
        index=index,
        cap=cap,
        running_keys=running_keys,
        book=ReservationBook(cap, snapshot.reservations, snapshot.running, snapshot.now),
        ctx=Context.of(snapshot, None if cache is None else cache.policy_memo(policy)),
        res=NodeResources.build(snapshot.fleet, snapshot.running, snapshot.pending),
        qos=QosUsage(snapshot.qos, snapshot.running),
        licenses=LicenseUsage(snapshot.licenses, snapshot.running),
        power=rack_load(snapshot, index, cap.free),
    )


def _split_pending(
    snap: Snapshot,
) -> tuple[list[tuple[JobRequest, str]], list[JobRequest], list[JobRequest], Sequence[JobRequest]]:
    """Held teams' jobs, blocked jobs, 0-GPU jobs and GPU jobs (most passes have only
    the last: the checks run at C speed and copy nothing then)."""
    pending: Sequence[JobRequest] = snap.pending
    held: list[tuple[JobRequest, str]] = []
    blocked: list[JobRequest] = []
    cpu_pending: list[JobRequest] = []
    if any(j.blocked is not None for j in pending):
        blocked = [j for j in pending if j.blocked is not None]
        pending = [j for j in pending if j.blocked is None]
    holds = {h.team: h.reason for h in snap.holds}
    if holds:
        held = [(j, holds[j.team]) for j in pending if j.team in holds]
        if held:
            pending = [j for j in pending if j.team not in holds]
    if 0 in map(_gpus_of, pending):
        cpu_pending = [j for j in pending if j.gpus == 0]
        pending = [j for j in pending if j.gpus != 0]
    return held, blocked, cpu_pending, pending
