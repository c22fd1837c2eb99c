"""Advance reservations inside a scheduling pass, and their admission.

Rules (what the pass enforces):

* **Inside its window** a reservation's GPUs are for its owners only: jobs that name it
  (they run nowhere else) and, automatically, jobs of its users or team (they use it
  first and fall back to the general pool). Owner jobs that already run on its nodes use
  up its GPUs; what is left is *unused*.
* **Before its window** a non-owner job may use reserved GPUs only if its time limit
  (or the policy's default limit) ends before the window starts: backfill around it.
* **At window start** running non-owner jobs on reserved GPUs are preempted if they are
  preemptible (most recently started first, so the least work is lost). GPUs held by
  non-preemptible jobs are replaced by free, unreserved GPUs of the same group, largest
  free blocks first; the plan reports each such move so the server can record it.
* **Estimated starts** treat unused reserved GPUs as busy until their window ends.

Every job sees the pass's capacity through a *view*: the real free counts, minus unused
GPUs of reservations that block it, capped by its own reservation's unused GPUs, and (for
EASY backfill's long jobs) capped by what the reserved head job leaves spare. Views are
count-only copies kept in step with the real capacity after every allocation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufleet.scheduler.capacity import Capacity, FleetIndex, GroupKey
from gpufleet.scheduler.model import Fleet, JobRequest, Reservation, ReservationMove, RunningJob
from gpufleet.scheduler.placement import Shape, choose_nodes, describe_shape, job_shape


@dataclass(frozen=True, slots=True)
class ViewSpec:
    blocked: frozenset[str] = frozenset()  # reservations whose unused GPUs this job may not use
    own: str | None = None  # only this reservation's unused GPUs
    shadow: bool = False  # capped by EASY backfill's spare GPUs

    @property
    def trivial(self) -> bool:
        return not self.blocked and self.own is None and not self.shadow


class ReservationBook:
    """Per-pass state of the snapshot's reservations and the capacity views."""

    def __init__(
        self, cap: Capacity, reservations: Sequence[Reservation], running: Iterable[RunningJob], now: float
    ) -> None:
        self.cap = cap
        self.now = now
        self.by_id = {r.id: r for r in reservations if r.end > now}
        id_of = cap.index.id_of
        self.unused: dict[str, dict[int, int]] = {}
        for r in self.by_id.values():
            self.unused[r.id] = {id_of[n]: c for n, c in r.nodes if n in id_of}
        running = list(running)
        for r in self.by_id.values():
            if r.active(now):
                left = self.unused[r.id]
                for rj in running:
                    if r.owns(rj.job):
                        for part in rj.placement:
                            nid = id_of.get(part.node)
                            if nid in left:
                                left[nid] = max(0, left[nid] - len(part.gpus))
        self.active = [r for r in self.by_id.values() if r.active(now)]
        self.upcoming = sorted((r for r in self.by_id.values() if r.start > now), key=lambda r: r.start)
        self.spare: dict[int, int] | None = None
        self._views: dict[ViewSpec, Capacity] = {}
        self.moves: list[ReservationMove] = []

    def __bool__(self) -> bool:
        return bool(self.by_id)

    @property
    def views(self) -> bool:
        """Whether any view exists that ``sync`` must keep up to date."""
        return bool(self._views)

    # -- which view a job gets ----------------------------------------------------------
    def owned_active(self, job: JobRequest) -> Reservation | None:
        for r in self.active:
            if r.owns(job):
                return r
        return None

    def spec(self, job: JobRequest, limit_s: float, *, long_backfill: bool) -> ViewSpec:
        end = self.now + limit_s
        blocked = frozenset(
            r.id for r in (*self.active, *(u for u in self.upcoming if u.start < end)) if not r.owns(job)
        )
        return ViewSpec(blocked=blocked, shadow=long_backfill)

    def view(self, spec: ViewSpec) -> Capacity:
        if spec.trivial:
            return self.cap
        hit = self._views.get(spec)
        if hit is None:
            hit = self._views[spec] = self.cap.counts_copy()
            nodes: Iterable[int] = range(len(self.cap.free)) if spec.own else self._touched(spec)
            for nid in nodes:
                hit.set_free(nid, self.free_in(spec, nid))
        return hit

    def _touched(self, spec: ViewSpec) -> set[int]:
        out: set[int] = set()
        for rid in spec.blocked:
            out.update(self.unused[rid])
        if spec.shadow and self.spare is not None:
            out.update(self.spare)
        return out

    def free_in(self, spec: ViewSpec, nid: int) -> int:
        free = self.cap.free[nid]
        if spec.own is not None:
            free = min(free, self.unused[spec.own].get(nid, 0))
        for rid in spec.blocked:
            free -= self.unused[rid].get(nid, 0)
        if spec.shadow and self.spare is not None and nid in self.spare:
            free = min(free, self.spare[nid])
        return max(0, free)

    def sync(self, nids: Iterable[int]) -> None:
        """Bring every view up to date after the real capacity changed on ``nids``."""
        if not self._views:
            return
        nids = list(nids)
        for spec, view in self._views.items():
            for nid in nids:
                view.set_free(nid, self.free_in(spec, nid))

    def used(self, own: str | None, counts: Iterable[tuple[int, int]]) -> None:
        """An owner job took GPUs inside its reservation: they are no longer unused."""
        if own is None:
            return
        left = self.unused[own]
        for nid, c in counts:
            if nid in left:
                left[nid] = max(0, left[nid] - c)

    def set_spare(self, spare: dict[int, int]) -> None:
        self.spare = spare
        for spec in [s for s in self._views if s.shadow]:
            del self._views[spec]

    # -- window start -------------------------------------------------------------------
    def window_conflicts(self, running: Sequence[RunningJob]) -> list[tuple[Reservation, RunningJob]]:
        """Non-owner jobs holding GPUs that an active reservation needs, latest start
        first: (reservation, job) pairs; the caller preempts the preemptible ones."""
        id_of = self.cap.index.id_of
        out: list[tuple[Reservation, RunningJob]] = []
        for r in self.active:
            short = {nid: need - self.cap.free[nid] for nid, need in self.unused[r.id].items()}
            short = {nid: s for nid, s in short.items() if s > 0}
            if not short:
                continue
            for rj in sorted(running, key=lambda x: x.started_at, reverse=True):
                if r.owns(rj.job) or not rj.job.gpus:
                    continue  # an owner, or a 0-GPU job: it holds none of the GPUs
                hits = [id_of[p.node] for p in rj.placement if id_of.get(p.node) in short]
                if hits and any(short[n] > 0 for n in hits):
                    out.append((r, rj))
                    for p in rj.placement:
                        nid = id_of.get(p.node)
                        if nid in short:
                            short[nid] -= len(p.gpus)
        return out

    def move_shortfalls(self) -> None:
        """After preemptions: what non-preemptible jobs still hold moves to free GPUs."""
        nodes = self.cap.index.nodes
        reserved_elsewhere: dict[int, int] = {}
        for left in self.unused.values():
            for nid, c in left.items():
                reserved_elsewhere[nid] = reserved_elsewhere.get(nid, 0) + c
        for r in self.active:
            left = self.unused[r.id]
            for nid in sorted(left):
                short = left[nid] - self.cap.free[nid]
                group = nodes[nid].group
                if short <= 0 or group is None:
                    continue
                spare = [
                    (self.cap.free[o] - reserved_elsewhere.get(o, 0), o)
                    for o in self.cap.index.groups[group].nodes
                    if o not in left and self.cap.free[o] - reserved_elsewhere.get(o, 0) > 0
                ]
                for room, other in sorted(spare, key=lambda x: (-x[0], x[1])):
                    take = min(room, short)
                    left[nid] -= take
                    left[other] = left.get(other, 0) + take
                    reserved_elsewhere[other] = reserved_elsewhere.get(other, 0) + take
                    short -= take
                    self.moves.append(
                        ReservationMove(
                            reservation=r.id, from_node=nodes[nid].name, to_node=nodes[other].name, gpus=take
                        )
                    )
                    if short == 0:
                        break

    # -- estimates ------------------------------------------------------------------------
    def hold_events(self) -> list[tuple[float, int, int]]:
        """(end, node, GPUs): unused reserved GPUs counted busy until their window ends."""
        return [
            (self.by_id[rid].end, nid, c) for rid, left in self.unused.items() for nid, c in left.items() if c
        ]


def admit_reservation(
    fleet: Fleet,
    existing: Sequence[Reservation],
    *,
    gpus: int,
    start: float,
    end: float,
    gpus_per_node: int = 0,
    nodes: int = 0,
    gpu_type: str | None = None,
    pool: str = "default",
    node_names: Sequence[str] = (),
) -> tuple[tuple[str, int], ...] | str:
    """Choose GPUs for a new reservation over ``[start, end)`` that no existing
    reservation overlapping that window holds; or say why not, naming the conflicts.

    Running jobs do not block admission: at window start they are preempted or the
    reservation moves (see the module docstring). Unhealthy GPUs and cordoned nodes are
    left out. ``node_names`` (operators' maintenance bookings) takes every healthy GPU of
    those nodes.
    """
    from gpufleet.scheduler.options import gpu_type_matches, no_such_model, same_kind

    index = FleetIndex(fleet)
    overlapping = [r for r in existing if r.start < end and start < r.end]
    held: dict[int, int] = {}
    for r in overlapping:
        for name, c in r.nodes:
            nid = index.id_of.get(name)
            if nid is not None:
                held[nid] = held.get(nid, 0) + c
    conflicts = ", ".join(sorted(r.id for r in overlapping)) or "none"
    if node_names:
        out: list[tuple[str, int]] = []
        for name in node_names:
            nid = index.id_of.get(name)
            if nid is None:
                return f"unknown node {name}"
            if held.get(nid):
                clash = sorted(r.id for r in overlapping if any(n == name for n, _ in r.nodes))
                return f"node {name} is already reserved in that window by {', '.join(clash)}"
            out.append((name, len(index.nodes[nid].healthy)))
        return tuple(out)
    free = [max(0, f - held.get(nid, 0)) for nid, f in enumerate(index.base_free)]
    cap = Capacity(index, free)
    request = JobRequest(
        id="reservation", gpus=gpus, gpus_per_node=gpus_per_node, nodes=nodes, submit_time=start
    )
    groups = same_kind([g for k, g in sorted(index.groups.items()) if k[0] == pool], gpu_type)
    if gpu_type:
        groups = [g for g in groups if gpu_type_matches(gpu_type, g.key[1])]
    if not groups:
        return (
            no_such_model(gpu_type, pool, models=index.groups)
            if gpu_type
            else f"no schedulable GPUs in pool {pool}"
        )
    why = ""
    for g in groups:
        shape = job_shape(request, g.size)
        if isinstance(shape, str):
            why = shape
            continue
        counts = choose_nodes(cap, g.key, shape)
        if counts is not None:
            return tuple((index.nodes[nid].name, c) for nid, c in counts)
        why = _refusal(cap, g.key, shape, conflicts)
    return why


def _refusal(cap: Capacity, gk: GroupKey, shape: Shape, conflicts: str) -> str:
    group = cap.groups[gk]
    return (
        f"cannot guarantee {describe_shape(shape)} of {gk[1]} in that window: "
        f"{group.total} unreserved, largest block {group.largest_block()}; "
        f"overlapping reservations: {conflicts}"
    )
