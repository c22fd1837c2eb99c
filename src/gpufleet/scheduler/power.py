"""The rack power rule of a pass: nothing new starts in a rack whose estimated draw would
go past its cap (``powermodel.py``: the budget less its headroom, and how draw is
estimated).

``RackLoad`` is one pass's per-rack counter: the draw of each budgeted rack as the
snapshot leaves it, then as the pass starts and preempts jobs (``placing.take`` and
``preempt._evict`` keep it current). Cheap on purpose:

- a rack is *tight* when its room (cap less draw) is short of what its free GPUs would
  add if all of them were busy. Starting a job moves room and that sum by the same
  amount, so a rack that is not tight at the start of a pass never becomes tight in it
  (a preemption may: its rack is recounted). Racks that are not tight cost nothing;
- in a tight rack a node shows at most as many free GPUs as the rack's room powers
  (``mask``), so best fit never picks what the rack cannot feed; a gang split over
  several nodes of one tight rack is checked as a whole (``over``) and placed again
  without the racks it would overload.

A job that only power holds back waits with reason ``Power`` (``describe``: "rack r3 at
27.1/28.0 kW, job adds 2.8 kW"), without an estimated start (GPUs free up on their
time limits, watts as readings change). Running jobs are never preempted for power
(``holds_back`` keeps the preemption step away from such a job), and a preemption whose
result would overload a rack is not made (``allows``). A rack already over its cap (a
budget lowered, readings that rose) keeps what runs and starts nothing new.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpufleet.migindex import device_kind, slice_parent_model, slice_share_of
from gpufleet.scheduler.capacity import Capacity, FleetIndex
from gpufleet.scheduler.model import RunningJob, Snapshot
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.powermodel import PowerModel, RackBudget, board_power_w, default_base_w

__all__ = ["RackLoad", "estimate_draw", "rack_load"]

_EPS = 1e-6


@dataclass(slots=True)
class RackLoad:
    """Estimated draw of the budgeted racks during one pass (see the module docstring)."""

    budgets: dict[str, RackBudget]
    draw_w: dict[str, float]
    rack_of: list[str | None]
    """Node id -> its budgeted rack (None: its rack has no budget)."""
    add_w: list[float]
    """Node id -> what one more busy device there adds: board less idle power, W."""
    busy_w: list[float]
    idle_w: list[float]
    nodes_of: dict[str, list[int]]
    measured: dict[tuple[str, int], float]
    tight: set[str]
    settled_by: float
    """A busy GPU's reading counts if its job started by then (``PowerModel.settle_s``)."""
    hit: bool = False
    """The last ``mask`` or ``over`` held something back (a job's wait may be Power)."""
    _dry: bool | None = None
    _limits: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """id(options) -> (node id, devices its rack powers) of its groups' nodes in tight racks."""
    _said: dict[int, str] = field(default_factory=dict)
    """id(options) -> ``describe``'s words."""

    def _changed(self) -> None:
        """Draw changed: what was worked out from it is stale."""
        self._dry = None
        self._limits.clear()
        self._said.clear()

    def room_w(self, rack: str) -> float:
        return self.budgets[rack].cap_w - self.draw_w[rack]

    def recount(self, free: Sequence[int], racks: Iterable[str]) -> None:
        """Whether each of ``racks`` is tight, from its free GPUs now."""
        for rack in racks:
            need = sum(free[n] * self.add_w[n] for n in self.nodes_of[rack])
            if self.room_w(rack) + _EPS < need:
                self.tight.add(rack)
            else:
                self.tight.discard(rack)

    def powered(self, nid: int) -> int | None:
        """How many more devices of node ``nid`` its rack can power (None: no limit)."""
        rack = self.rack_of[nid]
        if rack is None or rack not in self.tight or self.add_w[nid] <= 0:
            return None
        return max(0, int((self.room_w(rack) + _EPS) // self.add_w[nid]))

    def powered_in(self, rack: str) -> int:
        """How many more devices ``rack`` can power, at its hungriest node's rate."""
        most = max((self.add_w[n] for n in self.nodes_of[rack]), default=0.0)
        if most <= 0:
            return 1 << 30  # nothing there draws more when busy
        return max(0, int((self.room_w(rack) + _EPS) // most))

    def mask(self, index: FleetIndex, view: Capacity, opts: Options) -> list[tuple[int, int]]:
        """(node id, devices its rack powers) for the nodes of ``opts``' groups where
        that is less than ``view`` shows free."""
        limits = self._limits.get(id(opts))
        if limits is None:  # jobs of one shape share one options list (filters.options)
            keys = {gk for gk, _ in opts}
            limits = self._limits[id(opts)] = [
                (nid, n)
                for rack in self.budgets  # the snapshot's order, never a set's (best fit reads it)
                if rack in self.tight
                for nid in self.nodes_of[rack]
                if index.nodes[nid].group in keys and (n := self.powered(nid)) is not None
            ]
        free = view.free
        out = [(nid, n) for nid, n in limits if n < free[nid]]
        if out:
            self.hit = True
        return out

    def over(self, counts: Iterable[tuple[int, int]]) -> set[str]:
        """The racks that ``counts`` (node id, devices) would take past their cap."""
        added: dict[str, float] = {}
        for nid, c in counts:
            rack = self.rack_of[nid]
            if rack is not None:
                added[rack] = added.get(rack, 0.0) + c * self.add_w[nid]
        bad = {r for r, w in added.items() if w > self.room_w(r) + _EPS}
        if bad:
            self.hit = True
        return bad

    def dry(self, free: Sequence[int]) -> bool:
        """No node with a free device has power for one more (nothing can start: the
        pass may stop early, as when no GPU is free). Kept until the next change."""
        if self._dry is None:
            self._dry = all(
                not f or ((n := self.powered(nid)) is not None and n == 0) for nid, f in enumerate(free)
            )
        return self._dry

    def take(self, counts: Iterable[tuple[int, int]]) -> None:
        """Devices of ``counts`` turn busy (a start)."""
        self._changed()
        for nid, c in counts:
            rack = self.rack_of[nid]
            if rack is not None:
                self.draw_w[rack] += c * self.add_w[nid]

    def job_w(self, index: FleetIndex, rj: RunningJob) -> dict[str, float]:
        """Per budgeted rack, what ``rj``'s devices draw above idle, as counted."""
        out: dict[str, float] = {}
        settled = rj.started_at <= self.settled_by
        for part in rj.placement:
            nid = index.id_of.get(part.node)
            rack = None if nid is None else self.rack_of[nid]
            if nid is None or rack is None:
                continue
            w = 0.0
            for g in part.gpus:
                m = self.measured.get((part.node, g)) if settled else None
                w += (self.busy_w[nid] if m is None else m) - self.idle_w[nid]
            out[rack] = out.get(rack, 0.0) + w
        return out

    def allows(
        self, index: FleetIndex, counts: Iterable[tuple[int, int]], freed: Iterable[RunningJob]
    ) -> bool:
        """Whether starting ``counts`` once ``freed`` stop keeps every rack in its cap."""
        delta: dict[str, float] = {}
        for rj in freed:
            for r, w in self.job_w(index, rj).items():
                delta[r] = delta.get(r, 0.0) - w
        for nid, c in counts:
            rack = self.rack_of[nid]
            if rack is not None:
                delta[rack] = delta.get(rack, 0.0) + c * self.add_w[nid]
        ok = all(w <= 0 or w <= self.room_w(r) + _EPS for r, w in delta.items())
        if not ok:
            self.hit = True
        return ok

    def release(self, index: FleetIndex, rj: RunningJob, free: Sequence[int]) -> None:
        """``rj`` is preempted: its devices go back to idle."""
        self._changed()
        changed = self.job_w(index, rj)
        for rack, w in changed.items():
            self.draw_w[rack] -= w
        self.recount(free, changed)

    def holds_back(self, view: Capacity, opts: Options) -> bool:
        """Power, not GPUs, held the job back: its shape fits ``view`` unmasked."""
        return self.hit and any(view.groups[gk].fits(shape) for gk, shape in opts)

    def describe(self, index: FleetIndex, opts: Options) -> str:
        """Why power holds a job of ``opts`` back: the tight rack of its groups with
        the most room, its draw against its cap, and what the job would add there."""
        said = self._said.get(id(opts))
        if said is None:
            said = self._said[id(opts)] = self._describe(index, opts)
        return said

    def _describe(self, index: FleetIndex, opts: Options) -> str:
        keys = {gk for gk, _ in opts}
        best: tuple[float, str, float] | None = None
        for rack in sorted(self.budgets):
            adds = [self.add_w[n] for n in self.nodes_of[rack] if index.nodes[n].group in keys]
            if adds:
                room = self.room_w(rack)
                if best is None or room > best[0]:
                    best = (room, rack, max(adds))
        if best is None:
            return "no rack of its GPUs has power to spare"
        _, rack, per = best
        gpus = max(sum(shape) for _, shape in opts)
        cap = self.budgets[rack].cap_w
        return (
            f"rack {rack} at {self.draw_w[rack] / 1000:.1f}/{cap / 1000:.1f} kW, "
            f"job adds {gpus * per / 1000:.1f} kW"
        )


def rack_load(snap: Snapshot, index: FleetIndex, free: Sequence[int]) -> RackLoad | None:
    """The pass's counter, from the snapshot (None: no rack of the fleet has a budget)."""
    model = snap.power
    if model is None or not model.racks:
        return None
    budgets = {b.rack: b for b in model.racks}
    fleet = snap.fleet.nodes
    if not any(n.rack in budgets for n in fleet):
        return None
    measured = {(n, g): w for n, g, w in model.measured}
    n = len(fleet)
    load = RackLoad(
        budgets=budgets,
        draw_w={r: 0.0 for r in budgets},
        rack_of=[None] * n,
        add_w=[0.0] * n,
        busy_w=[0.0] * n,
        idle_w=[0.0] * n,
        nodes_of={r: [] for r in budgets},
        measured=measured,
        tight=set(),
        settled_by=snap.now - model.settle_s,
    )
    _idle_draw(load, model, snap)
    for rj in snap.running:
        settle = rj.started_at <= load.settled_by
        for part in rj.placement:
            nid = index.id_of.get(part.node)
            rack = None if nid is None else load.rack_of[nid]
            if nid is None or rack is None:
                continue
            for g in part.gpus:
                m = measured.get((part.node, g))
                idle = load.idle_w[nid] if m is None else m  # what _idle_draw counted
                busy = load.busy_w[nid] if m is None or not settle else m
                load.draw_w[rack] += busy - idle
    load.recount(free, budgets)
    return load


def _idle_draw(load: RackLoad, model: PowerModel, snap: Snapshot) -> None:
    """Every budgeted rack's draw with all its GPUs idle; each node's per-device figures."""
    board = dict(model.board_w)
    node_board = dict(model.node_board_w)
    base = dict(model.node_base_w)
    measured = load.measured
    for nid, node in enumerate(snap.fleet.nodes):
        rack = node.rack
        if rack not in load.budgets:
            continue
        load.rack_of[nid] = rack
        load.nodes_of[rack].append(nid)
        kind = device_kind(node.model) if node.gpus else "gpu"
        parent = slice_parent_model(node.model)
        physical = node.name.partition(":")[0]
        per = node_board.get(physical, board.get(parent, board_power_w(parent) if node.gpus else 0.0))
        if kind != "gpu":
            per *= slice_share_of(node.model)
        idle = per * model.idle_fraction
        load.busy_w[nid], load.idle_w[nid], load.add_w[nid] = per, idle, per - idle
        w = base.get(node.name, default_base_w(len(node.gpus))) if kind == "gpu" else 0.0
        for g in node.gpus:
            m = measured.get((node.name, g.index)) if kind == "gpu" else None
            w += idle if m is None else m
        load.draw_w[rack] += w


def estimate_draw(snap: Snapshot, racks: Iterable[str]) -> dict[str, float]:
    """Each of ``racks``' estimated draw, W, as a pass over ``snap`` counts it (budget
    or not: for the page, ``/metrics`` and ``gpufleet admin rack list``)."""
    model = snap.power or PowerModel(racks=())
    have = {b.rack for b in model.racks}
    extra = tuple(RackBudget(rack=r, budget_w=float("inf")) for r in sorted(set(racks) - have))
    wide = replace(snap, power=replace(model, racks=model.racks + extra))
    load = rack_load(wide, FleetIndex(snap.fleet), [0] * len(snap.fleet.nodes))
    return {} if load is None else {r: load.draw_w[r] for r in racks if r in load.draw_w}
