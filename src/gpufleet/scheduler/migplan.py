"""The MIG planner (``gpufleet server --auto-mig``): which idle GPUs to lay out anew.

Dynamic MIG that no reference system ships stably: operators cut GPUs by hand, and slice
jobs wait while a GPU cut for another profile sits idle. Per pool, from what waits and
what each GPU holds, ``plan_layouts`` picks a few idle GPUs and their new layouts; the
server asks them as an operator would (``server/loops/automig.py`` through
``services/miglayouts.set_layout``: cordon, event, the node's agent applies it).

The rules, per pool (pools in name order, GPUs in (node, index) order, so one input
always gives one answer):

- *Slices wait, no whole GPU does*: idle MIG-mode GPUs whose layout serves none of the
  waiting profiles get a layout packed with them, largest profile first (first-fit
  decreasing, each step checked by ``mig.place_layout``), the room left filled with the
  most wanted waiting profile that still fits, so little of the GPU is left idle. The
  slices that are already coming (layouts pending) or free (idle GPUs that have the
  profile) are counted first, and GPUs are laid out only until the rest is covered.
- *Whole GPUs wait, no slice does*: idle MIG-mode GPUs (no job on any of their slices)
  go back to whole, as many as whole GPUs wait (less those already on their way),
  first on the nodes with the most idle whole GPUs (a gang of one node's GPUs).
- *Both wait, or neither*: nothing (the two would undo each other).

Never touched: a GPU a job holds (or one of its slices), one with a layout pending, one
cordoned by an operator or a health rule, one whose node is not ready, one whose last
layout failed (left for an operator), one laid out less than ``cooldown_s`` ago (no
flapping), one of a model without MIG profiles, and one with MIG mode off: turning MIG
mode on takes a GPU reset on most drivers (``nvidia-smi -i N -mig 1`` with the GPU
idle), which is the operator's call, not a loop's. At most ``max_changes`` GPUs per
call. Going back to whole turns MIG mode off, which on such drivers also waits for a
reset: the node then reports the layout failed and the GPU stays cordoned for an
operator (and is left alone here until one asks a layout or lifts the cordon).

Waiting slices are counted per GPU type as jobs ask ("MIG 1g.10gb", "H100 MIG 1g.10gb")
and matched to a GPU by the scheduling core's own rule (``options.gpu_type_matches``
against the GPU's slice model). Whole demand counts only asks that some GPU of the pool
could serve (a GPU type naming none of its models, or a share, is not whole demand).
Pure: no clock (``now`` is an argument), no I/O, no state kept between calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet import mig
from gpufleet.migindex import PROFILE_NAME
from gpufleet.scheduler.options import gpu_type_matches

MAX_CHANGES = 2
"""GPUs laid out per call, by default: a planner that guessed wrong costs little."""
COOLDOWN_S = 600.0
"""A GPU laid out (by anyone) less than this long ago is left alone, by default."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """One waiting job's ask: ``gpus`` devices of ``gpu_type`` (MIG slices when it asks for
    them, ``mig.wants_slices``; else whole GPUs) in ``pool``. Only jobs in the queue: not
    held, not blocked (dependencies, begin time, budget holds)."""

    pool: str
    gpu_type: str | None
    gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MigGpu:
    """One GPU of the fleet as the planner sees it."""

    node: str
    index: int
    pool: str
    model: str
    """As the node reports it ("NVIDIA H100 80GB HBM3"): ``mig.model_for`` finds its table."""
    mig_enabled: bool
    layout: tuple[str, ...] = ()
    """Its MIG instances' profiles now (MIG mode on with none: ``()``)."""
    held: bool = False
    """A job holds it or one of its slices (or may still run there: stopping)."""
    pending: tuple[str, ...] | None = None
    """A layout asked and not applied yet (``()``: the whole GPU); None: none."""
    cordoned: bool = False
    """Out of service by an operator or a health rule (not by a pending layout)."""
    ready: bool = True
    """Its node is up and takes work (not NotReady, cordoned or draining)."""
    failed: bool = False
    """The last layout asked for it failed on the node: an operator's to look at."""
    last_changed: float | None = None
    """When a layout was last asked for it (None: never, or long ago)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Relayout:
    """A decision: lay out GPU ``index`` of ``node`` as ``layout`` (``()``: whole again)."""

    node: str
    index: int
    layout: tuple[str, ...]
    reason: str
    """What waits, in words: "3 1g.10gb slices waiting"."""


def profile_of(gpu_type: str | None) -> str | None:
    """The MIG profile a slice job's GPU type names ("H100 MIG 3g.40gb" -> "3g.40gb"), None
    when it names none."""
    if not mig.wants_slices(gpu_type):
        return None
    assert gpu_type is not None
    names = [t for t in gpu_type.lower().split() if PROFILE_NAME.fullmatch(t)]
    return names[-1] if names else None


def fits(model: mig.GpuModel, layout: Sequence[str]) -> bool:
    """Whether one GPU of ``model`` can hold ``layout`` (``mig.place_layout``'s verdict)."""
    try:
        mig.place_layout(model, layout)
    except mig.LayoutError:
        return False
    return True


def _size(model: mig.GpuModel, name: str) -> tuple[int, int]:
    p = model.profiles[name]
    return (p.compute_slices, p.memory_slices)


def _largest_first(model: mig.GpuModel, name: str) -> tuple[int, int, str]:
    compute, memory = _size(model, name)
    return (-compute, -memory, name)


def pack(model: mig.GpuModel, wants: Mapping[str, int]) -> tuple[str, ...]:
    """A legal layout of one ``model`` GPU serving ``wants`` (profile -> slices waiting):
    each profile in turn, largest first, as many as wait and fit; then the room left
    filled with the most wanted of them that still fits (ties: the smallest), then the
    next, so no slice is left empty that a waiting job could use. Largest first: the
    large asks are the ones that fit nowhere else. ``()`` when none of them fits."""
    names = sorted(
        (p for p, n in wants.items() if n > 0 and p in model.profiles),
        key=lambda p: _largest_first(model, p),
    )
    layout: list[str] = []
    for name in names:
        for _ in range(wants[name]):
            if not fits(model, [*layout, name]):
                break
            layout.append(name)
    if not layout:
        return ()
    for name in sorted(names, key=lambda p: (-wants[p], *_size(model, p), p)):
        while fits(model, [*layout, name]):
            layout.append(name)
    return tuple(sorted(layout, key=lambda p: _largest_first(model, p)))


def plan_layouts(
    *,
    waiting: Iterable[Waiting],
    gpus: Iterable[MigGpu],
    now: float,
    max_changes: int = MAX_CHANGES,
    cooldown_s: float = COOLDOWN_S,
) -> list[Relayout]:
    """The GPUs to lay out anew and how, at most ``max_changes`` (see the module's rules)."""
    asks: dict[str, list[Waiting]] = {}
    for w in waiting:
        if w.gpus > 0:
            asks.setdefault(w.pool, []).append(w)
    pools: dict[str, list[MigGpu]] = {}
    for g in sorted(gpus, key=lambda g: (g.node, g.index)):
        pools.setdefault(g.pool, []).append(g)
    out: list[Relayout] = []
    for pool, here in sorted(pools.items()):
        room = max_changes - len(out)
        if room <= 0:
            break
        slices = _slice_demand(asks.get(pool, ()), here)
        whole = _whole_demand(asks.get(pool, ()), here)
        free = [g for g in here if _free(g, now=now, cooldown_s=cooldown_s)]
        if slices and not whole:
            out += _to_slices(slices, here, free, room)
        elif whole and not slices:
            out += _to_whole(whole, here, free, room)
    return out


_Ask = tuple[str, str]
"""A slice ask: (GPU type as jobs write it, lower case; its profile)."""


def _in_service(g: MigGpu) -> bool:
    return g.ready and not g.cordoned and not g.failed


def _free(g: MigGpu, *, now: float, cooldown_s: float) -> bool:
    """May be laid out now: MIG mode on, idle, in service, nothing pending, cooled down."""
    cooling = g.last_changed is not None and now - g.last_changed < cooldown_s
    return g.mig_enabled and not g.held and g.pending is None and _in_service(g) and not cooling


def _serves(ask: _Ask, g: MigGpu, profile: str) -> bool:
    """Whether a ``profile`` instance of GPU ``g`` is a slice ``ask`` could get."""
    return profile == ask[1] and gpu_type_matches(ask[0], mig.slice_model(g.model, profile))


def _slice_demand(asks: Iterable[Waiting], here: Sequence[MigGpu]) -> dict[_Ask, int]:
    """Slices waiting per ask, for asks some MIG-capable GPU of the pool could serve."""
    counts: dict[_Ask, int] = {}
    for w in asks:
        profile = profile_of(w.gpu_type)
        if profile is not None:
            ask = (" ".join((w.gpu_type or "").lower().split()), profile)
            counts[ask] = counts.get(ask, 0) + w.gpus
    models = {g.model: mig.model_for(g.model) for g in here}

    def servable(ask: _Ask, g: MigGpu) -> bool:
        model = models[g.model]
        return model is not None and ask[1] in model.profiles and _serves(ask, g, ask[1])

    return {ask: n for ask, n in counts.items() if any(servable(ask, g) for g in here)}


def _whole_demand(asks: Iterable[Waiting], here: Sequence[MigGpu]) -> dict[str | None, int]:
    """Whole GPUs waiting per GPU type (None: any), for asks some GPU of the pool could serve."""
    counts: dict[str | None, int] = {}
    for w in asks:
        if not mig.wants_slices(w.gpu_type):
            key = " ".join(w.gpu_type.lower().split()) if w.gpu_type else None
            counts[key] = counts.get(key, 0) + w.gpus
    models = {g.model for g in here}
    return {k: n for k, n in counts.items() if k is None or any(gpu_type_matches(k, m) for m in models)}


def _take(remaining: dict[_Ask, int], g: MigGpu, layout: Iterable[str]) -> None:
    """Count the instances of ``layout`` on ``g`` against the asks they serve."""
    for profile in layout:
        for ask in sorted(remaining):
            if remaining[ask] > 0 and _serves(ask, g, profile):
                remaining[ask] -= 1
                break


def _to_slices(
    demand: dict[_Ask, int], here: Sequence[MigGpu], free: Sequence[MigGpu], room: int
) -> list[Relayout]:
    remaining = dict(demand)
    for g in here:  # what is coming or free already
        if g.pending is not None:
            _take(remaining, g, g.pending)
        elif g.mig_enabled and not g.held and _in_service(g):
            _take(remaining, g, g.layout)
    out: list[Relayout] = []
    for g in free:
        if len(out) >= room or not any(remaining.values()):
            break
        model = mig.model_for(g.model)
        open_asks = [a for a, n in remaining.items() if n > 0]
        if model is None or any(_serves(a, g, p) for a in open_asks for p in g.layout):
            continue
        wants: dict[str, int] = {}
        for a in open_asks:
            if a[1] in model.profiles and _serves(a, g, a[1]):
                wants[a[1]] = wants.get(a[1], 0) + remaining[a]
        layout = pack(model, wants)
        if not layout or sorted(layout) == sorted(g.layout):
            continue
        words = ", ".join(_count(wants[p], f"{p} slice") for p in dict.fromkeys(layout))
        out.append(Relayout(node=g.node, index=g.index, layout=layout, reason=f"{words} waiting"))
        _take(remaining, g, layout)
    return out


def _to_whole(
    demand: dict[str | None, int], here: Sequence[MigGpu], free: Sequence[MigGpu], room: int
) -> list[Relayout]:
    remaining = dict(demand)
    keys = sorted(remaining, key=lambda k: (k is not None, k or ""))

    def claim(g: MigGpu) -> int:
        """Count ``g`` against the first whole ask it serves; the GPUs that ask waited for."""
        for k in keys:
            if remaining[k] > 0 and (k is None or gpu_type_matches(k, g.model)):
                waited = sum(n for j, n in remaining.items() if j is None or gpu_type_matches(j, g.model))
                remaining[k] -= 1
                return waited
        return 0

    for g in here:
        if g.pending == ():
            claim(g)
    idle_whole: dict[str, int] = {}
    for g in here:
        if not g.mig_enabled and not g.held and g.pending is None and _in_service(g):
            idle_whole[g.node] = idle_whole.get(g.node, 0) + 1
    out: list[Relayout] = []
    for g in sorted(free, key=lambda g: (-idle_whole.get(g.node, 0), g.node, g.index)):
        if len(out) >= room or not any(remaining.values()):
            break
        waited = claim(g)
        if waited:
            out.append(
                Relayout(
                    node=g.node, index=g.index, layout=(), reason=f"{_count(waited, 'whole GPU')} waiting"
                )
            )
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


__all__ = [
    "COOLDOWN_S",
    "MAX_CHANGES",
    "MigGpu",
    "Relayout",
    "Waiting",
    "fits",
    "pack",
    "plan_layouts",
    "profile_of",
]
