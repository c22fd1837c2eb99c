"""NVIDIA MIG (Multi-Instance GPU) profiles and where each may be placed, per GPU model.

The one table that the scheduler core (which slices fit a job), the node agent (which
GPU instances to create through NVML) and the CLI (``gpufleet node mig NODE --gpu 3
--layout 2g.20gb,2g.20gb,3g.40gb``) share, so that they cannot disagree about what a
layout means. Standard library only: the agent imports it on machines without the rest.

A MIG-capable GPU of these models has 8 memory slices and 7 compute slices. A GPU
instance occupies ``size`` consecutive memory slices from a ``start`` that its profile
allows: the ``(start, size)`` of NVML's ``nvmlGpuInstancePlacement_t``, which the agent
passes to ``nvmlDeviceCreateGpuInstanceWithPlacement`` unchanged. Instances may not share
a memory slice, and together they use at most 7 compute slices.

Memory sizes are the nominal ones in the profile names (``3g.40gb``: 40 GiB, 40960 MiB).
The memory NVML reports for a created instance is a little less (a 1g.5gb has about
4.75 GiB); the agent reports what NVML says, this table is for choosing and naming.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gpufleet.migindex import (  # how the scheduler and agents name slices (see __all__)
    MEMORY_SLICES,
    PROFILE_NAME,
    SHARE_BASE,
    SHARE_TAG,
    SHARE_UNITS,
    SLICE_BASE,
    SLICE_TAG,
    device_gpu,
    device_kind,
    device_label,
    device_labels,
    is_share_model,
    is_slice_model,
    layout_words,
    physical_node,
    share_gpu_type,
    share_index,
    share_model,
    share_node,
    share_of,
    slice_gpu_type,
    slice_index,
    slice_model,
    slice_node,
    slice_of,
    slice_parent_model,
    slice_share_of,
    wanted_kind,
    wants_share,
    wants_slices,
)

NVML_GPU_INSTANCE_PROFILE_1_SLICE: Final = 0
NVML_GPU_INSTANCE_PROFILE_2_SLICE: Final = 1
NVML_GPU_INSTANCE_PROFILE_3_SLICE: Final = 2
NVML_GPU_INSTANCE_PROFILE_4_SLICE: Final = 3
NVML_GPU_INSTANCE_PROFILE_7_SLICE: Final = 4
NVML_GPU_INSTANCE_PROFILE_8_SLICE: Final = 5
NVML_GPU_INSTANCE_PROFILE_6_SLICE: Final = 6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: Final = 7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: Final = 8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: Final = 9

COMPUTE_SLICES: Final = 7


class LayoutError(ValueError):
    """A MIG layout that the GPU cannot hold, with the reason in words for the operator."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One GPU-instance profile of one GPU model, e.g. ``3g.40gb`` on an H100-80GB."""

    name: str
    compute_slices: int
    """The ``N`` of ``Ng``: sevenths of the GPU's SMs."""
    memory_slices: int
    """Eighths of the GPU's memory; also the ``size`` of every placement."""
    memory_mib: int
    """The nominal memory of the name, in MiB (``3g.40gb``: 40 * 1024)."""
    max_instances: int
    """How many instances of this profile one GPU can hold at once."""
    starts: tuple[int, ...]
    """The memory slices where an instance may begin (``nvidia-smi mig -lgipp``)."""
    nvml_profile_id: int
    """The ``NVML_GPU_INSTANCE_PROFILE_*`` index for ``nvmlDeviceGetGpuInstanceProfileInfo``."""
    media_extensions: bool = False
    """A ``+me`` profile: holds the GPU's media engines (OFA, JPEG), so one per GPU."""

    @property
    def size(self) -> int:
        """Memory slices one placement occupies."""
        return self.memory_slices

    @property
    def memory_gb(self) -> int:
        """The memory the name states (``3g.40gb``: 40)."""
        return self.memory_mib // 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuModel:
    """A MIG-capable GPU model: its memory and the profiles it offers, by name."""

    name: str
    aliases: tuple[str, ...]
    """NVML product names and short names that ``model_for`` knows it by."""
    memory_mib: int
    """The whole GPU's nominal memory (``H200``: 141 GiB)."""
    profiles: Mapping[str, Profile]
    """Read-only, in the guide's order (smallest first)."""
    total_memory_slices: int = MEMORY_SLICES
    compute_slices: int = COMPUTE_SLICES

    def by_nvml_id(self, profile_id: int) -> Profile | None:
        """The profile NVML knows by ``profile_id`` on this model, so that the agent can
        name the instances it finds; None if this model has no such profile."""
        for p in self.profiles.values():
            if p.nvml_profile_id == profile_id:
                return p
        return None

    def profile(self, name: str) -> Profile:
        """The profile called ``name`` (case-insensitive); LayoutError naming the known
        ones, and the models that do have it, if this model has none by that name."""
        key = name.strip().lower()
        found = self.profiles.get(key)
        if found is not None:
            return found
        others = [m.name for m in MODELS if key in m.profiles]
        where = f" (a profile of {', '.join(others)})" if others else ""
        raise LayoutError(
            f"unknown profile {name.strip()} for {self.name}{where}; known: {', '.join(self.profiles)}"
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """One GPU instance of a layout: its profile and NVML's ``(start, size)``."""

    profile: str
    start: int
    size: int

    @property
    def slices(self) -> range:
        """The memory slices it occupies."""
        return range(self.start, self.start + self.size)


_NAME = PROFILE_NAME

_EVERY_SLICE = (0, 1, 2, 3, 4, 5, 6)
_PAIRS = (0, 2, 4, 6)
_TWO_G = (0, 2, 4)
_HALVES = (0, 4)
_FIRST = (0,)


def _profile(name: str, memory_slices: int, most: int, starts: tuple[int, ...], nvml: int) -> Profile:
    m = _NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"bad profile name in the MIG table: {name}")
    return Profile(
        name=name,
        compute_slices=int(m["g"]),
        memory_slices=memory_slices,
        memory_mib=int(m["gb"]) * 1024,
        max_instances=most,
        starts=starts,
        nvml_profile_id=nvml,
        media_extensions=m["me"] is not None,
    )


def _model(name: str, aliases: tuple[str, ...], memory_gb: int, *profiles: Profile) -> GpuModel:
    return GpuModel(
        name=name,
        aliases=aliases,
        memory_mib=memory_gb * 1024,
        profiles=MappingProxyType({p.name: p for p in profiles}),
    )


# NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles'
# (docs.nvidia.com/datacenter/tesla/mig-user-guide): per model the profiles, their fraction
# of memory (memory slices of 8) and instances available; the starts are its placement
# diagrams as `nvidia-smi mig -lgipp` prints them, alike on A100, H100 and H200:
# {0..6}:1 for 1g and 1g+me, {0,2,4,6}:2 for the double-memory 1g, {0,2,4}:2 for 2g,
# {0,4}:4 for 3g, {0}:4 for 4g and {0}:8 for 7g.
A100_40GB: Final = _model(
    "A100-40GB",
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB", "A100-40GB"),
    40,
    _profile("1g.5gb", 1, 7, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    _profile("1g.5gb+me", 1, 1, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1),
    _profile("1g.10gb", 2, 4, _PAIRS, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2),
    _profile("2g.10gb", 2, 3, _TWO_G, NVML_GPU_INSTANCE_PROFILE_2_SLICE),
    _profile("3g.20gb", 4, 2, _HALVES, NVML_GPU_INSTANCE_PROFILE_3_SLICE),
    _profile("4g.20gb", 4, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_4_SLICE),
    _profile("7g.40gb", 8, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_7_SLICE),
)

A100_80GB: Final = _model(
    "A100-80GB",
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "A100-SXM4-80GB", "A100 80GB PCIe", "A100-80GB"),
    80,
    _profile("1g.10gb", 1, 7, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    _profile("1g.10gb+me", 1, 1, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1),
    _profile("1g.20gb", 2, 4, _PAIRS, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2),
    _profile("2g.20gb", 2, 3, _TWO_G, NVML_GPU_INSTANCE_PROFILE_2_SLICE),
    _profile("3g.40gb", 4, 2, _HALVES, NVML_GPU_INSTANCE_PROFILE_3_SLICE),
    _profile("4g.40gb", 4, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_4_SLICE),
    _profile("7g.80gb", 8, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_7_SLICE),
)

H100_80GB: Final = _model(
    "H100-80GB",
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "H100 80GB HBM3", "H100 PCIe", "H100-80GB", "H100"),
    80,
    _profile("1g.10gb", 1, 7, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    _profile("1g.10gb+me", 1, 1, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1),
    _profile("1g.20gb", 2, 4, _PAIRS, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2),
    _profile("2g.20gb", 2, 3, _TWO_G, NVML_GPU_INSTANCE_PROFILE_2_SLICE),
    _profile("3g.40gb", 4, 2, _HALVES, NVML_GPU_INSTANCE_PROFILE_3_SLICE),
    _profile("4g.40gb", 4, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_4_SLICE),
    _profile("7g.80gb", 8, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_7_SLICE),
)

H100_94GB: Final = _model(
    "H100-94GB",
    ("NVIDIA H100 NVL", "H100 NVL", "H100-94GB"),
    94,
    _profile("1g.12gb", 1, 7, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    _profile("1g.12gb+me", 1, 1, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1),
    _profile("1g.24gb", 2, 4, _PAIRS, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2),
    _profile("2g.24gb", 2, 3, _TWO_G, NVML_GPU_INSTANCE_PROFILE_2_SLICE),
    _profile("3g.47gb", 4, 2, _HALVES, NVML_GPU_INSTANCE_PROFILE_3_SLICE),
    _profile("4g.47gb", 4, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_4_SLICE),
    _profile("7g.94gb", 8, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_7_SLICE),
)

H200: Final = _model(
    "H200",
    ("NVIDIA H200", "NVIDIA H200 NVL", "H200 NVL", "H200-141GB", "H200"),
    141,
    _profile("1g.18gb", 1, 7, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    _profile("1g.18gb+me", 1, 1, _EVERY_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1),
    _profile("1g.35gb", 2, 4, _PAIRS, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2),
    _profile("2g.35gb", 2, 3, _TWO_G, NVML_GPU_INSTANCE_PROFILE_2_SLICE),
    _profile("3g.71gb", 4, 2, _HALVES, NVML_GPU_INSTANCE_PROFILE_3_SLICE),
    _profile("4g.71gb", 4, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_4_SLICE),
    _profile("7g.141gb", 8, 1, _FIRST, NVML_GPU_INSTANCE_PROFILE_7_SLICE),
)

MODELS: Final[tuple[GpuModel, ...]] = (A100_40GB, A100_80GB, H100_80GB, H100_94GB, H200)

_BY_ALIAS: Final = {a.lower(): m for m in MODELS for a in (m.name, *m.aliases)}

_BY_FAMILY: Final[dict[str, dict[int | None, GpuModel]]] = {
    "a100": {40: A100_40GB, 80: A100_80GB},
    "h100": {80: H100_80GB, 94: H100_94GB, None: H100_80GB},
    "h200": {141: H200, None: H200},
}

_MEMORY_TOKEN = re.compile(r"([0-9]+)gb?")


def model_for(gpu_name: str) -> GpuModel | None:
    """The model of a GPU by its NVML product name ("NVIDIA A100-SXM4-40GB", "NVIDIA H100
    80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200") or a short name ("A100-80GB", "H100",
    "H200"), case-insensitive; a MIG device's name ("NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    gives its parent's model. None for a GPU not in the table.

    A name must settle the memory where the family has more than one size with different
    profiles: plain "A100" is None (40 GB and 80 GB slice differently, and a guess would
    have the agent ask NVML for profiles the GPU lacks). An H100 named without a size is
    the 80 GB one, which is every such NVML name ("NVIDIA H100 PCIe"); the 94 GB part is
    "NVIDIA H100 NVL" or "H100-94GB". H200 comes in one size (141 GB, NVL too).
    """
    text = re.split(r"\bmig\b", " ".join(gpu_name.lower().split()), maxsplit=1)[0].strip()
    exact = _BY_ALIAS.get(text) or _BY_ALIAS.get(text.removeprefix("nvidia "))
    if exact is not None:
        return exact
    tokens = [t for t in re.split(r"[^a-z0-9]+", text) if t]
    families = [t for t in tokens if t in _BY_FAMILY]
    if len(families) != 1:
        return None
    family = families[0]
    sizes = {int(m[1]) for t in tokens if (m := _MEMORY_TOKEN.fullmatch(t))}
    if len(sizes) > 1:
        return None
    size = sizes.pop() if sizes else None
    if size is None and family == "h100" and "nvl" in tokens:
        size = 94
    return _BY_FAMILY[family].get(size)


def parse_layout(text: str) -> list[str]:
    """``"2g.20gb, 2g.20gb,3G.40GB"`` -> ``["2g.20gb", "2g.20gb", "3g.40gb"]``: the CLI's
    ``--layout``, lower-cased, spaces stripped. Whether the profiles exist on a GPU is
    ``place_layout``'s question; ValueError here for an empty layout or an item that is
    not a profile name at all."""
    if not text.strip():
        raise ValueError("empty MIG layout: give profiles like 3g.40gb,2g.20gb")
    out: list[str] = []
    for i, raw in enumerate(text.split(","), start=1):
        item = raw.strip().lower()
        if not item:
            raise ValueError(f"empty item {i} in MIG layout {text!r}")
        if _NAME.fullmatch(item) is None:
            raise ValueError(
                f"item {i} of MIG layout {text!r} is not a MIG profile: {raw.strip()!r} "
                "(expected e.g. 1g.10gb, 3g.40gb or 1g.10gb+me)"
            )
        out.append(item)
    return out


def _spans(starts: Iterable[int], size: int) -> str:
    parts = [str(s) if size == 1 else f"{s}-{s + size - 1}" for s in starts]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _at_most(p: Profile) -> str:
    if p.media_extensions:
        return "one instance per GPU holds the media engines"
    apart: list[int] = []
    for s in p.starts:
        if (not apart or s >= apart[-1] + p.size) and len(apart) < p.max_instances:
            apart.append(s)
    return f"memory slices {_spans(apart, p.size)}"


def _sum_line(profiles: Sequence[Profile], what: str) -> str:
    return " + ".join(f"{p.name} ({getattr(p, what)})" for p in profiles)


def _check_totals(model: GpuModel, wanted: Sequence[Profile]) -> None:
    counts: dict[str, int] = {}
    for p in wanted:
        counts[p.name] = counts.get(p.name, 0) + 1
    for name, n in counts.items():
        p = model.profiles[name]
        if n > p.max_instances:
            raise LayoutError(
                f"{name} x{n} does not fit an {model.name}: at most {p.max_instances} ({_at_most(p)})"
            )
    compute = sum(p.compute_slices for p in wanted)
    if compute > model.compute_slices:
        raise LayoutError(
            f"layout needs {compute} compute slices, an {model.name} has {model.compute_slices}: "
            + _sum_line(wanted, "compute_slices")
        )
    memory = sum(p.memory_slices for p in wanted)
    if memory > model.total_memory_slices:
        raise LayoutError(
            f"layout needs {memory} memory slices, an {model.name} has {model.total_memory_slices}: "
            + _sum_line(wanted, "memory_slices")
        )


def place_layout(model: GpuModel, profiles: Sequence[str]) -> list[Placement]:
    """Legal, non-overlapping placements for a whole layout on one GPU, ordered by start.

    Larger profiles are placed first, each at its lowest free legal start, backtracking
    when the rest cannot follow, so one layout always gets the same placements (and a
    node's GPUs get alike ones). Only the table decides: starts, sizes, instances per
    profile and the 7 compute slices. LayoutError names the profile and the model: an
    unknown profile, too many of one, too many compute or memory slices, or no placement.
    """
    wanted = sorted(
        (model.profile(name) for name in profiles),
        key=lambda p: (-p.compute_slices, -p.memory_slices, p.name),
    )
    _check_totals(model, wanted)
    taken = [False] * model.total_memory_slices
    chosen: list[Placement] = []
    deepest = [0]

    def fill(i: int) -> bool:
        if i == len(wanted):
            return True
        deepest[0] = max(deepest[0], i)
        p = wanted[i]
        floor = chosen[-1].start + 1 if i and wanted[i - 1] is p else 0
        for start in p.starts:
            span = range(start, start + p.size)
            if start < floor or span.stop > len(taken) or any(taken[s] for s in span):
                continue
            for s in span:
                taken[s] = True
            chosen.append(Placement(p.name, start, p.size))
            if fill(i + 1):
                return True
            chosen.pop()
            for s in span:
                taken[s] = False
        return False

    if not fill(0):
        p = wanted[deepest[0]]
        raise LayoutError(
            f"no legal placement of {', '.join(q.name for q in wanted)} on an {model.name}: "
            f"{p.name} finds none of its starts ({', '.join(map(str, p.starts))}) free"
        )
    return sorted(chosen, key=lambda c: (c.start, c.profile))


def free_starts(model: GpuModel, placed: Sequence[Placement], profile: str) -> list[int]:
    """The starts where one more ``profile`` instance could be created next to the
    ``placed`` ones: legal for the profile, on free memory slices, within its instance
    limit and the GPU's compute slices. Empty if there is none; LayoutError for a profile
    (wanted or placed) that the model lacks."""
    p = model.profile(profile)
    used = [model.profile(q.profile) for q in placed]
    if sum(q.name == p.name for q in used) >= p.max_instances:
        return []
    if sum(q.compute_slices for q in used) + p.compute_slices > model.compute_slices:
        return []
    taken = {s for q in placed for s in q.slices}
    return [
        s
        for s in p.starts
        if s + p.size <= model.total_memory_slices and taken.isdisjoint(range(s, s + p.size))
    ]


def smallest_fitting(model: GpuModel, memory_mib: int) -> Profile | None:
    """The smallest profile with at least ``memory_mib`` of memory: fewest compute slices,
    then least memory, never a ``+me`` one (their media engines are one per GPU and are
    for jobs that ask for them). None if the whole GPU is too small."""
    if memory_mib < 0:
        raise ValueError(f"negative memory request: {memory_mib} MiB")
    fits = [p for p in model.profiles.values() if not p.media_extensions and p.memory_mib >= memory_mib]
    return min(fits, key=lambda p: (p.compute_slices, p.memory_mib), default=None)


def slice_share(profile: Profile) -> float:
    """The share of its GPU that an instance is billed and charged energy for: a slice
    costs its share of the GPU, slices/7 (compute, not memory: the SMs are what a job
    keeps from others; a 1g.20gb costs what a 1g.10gb does)."""
    return profile.compute_slices / COMPUTE_SLICES


__all__ = [
    "A100_40GB",
    "A100_80GB",
    "COMPUTE_SLICES",
    "H100_80GB",
    "H100_94GB",
    "H200",
    "MEMORY_SLICES",
    "MODELS",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_6_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_8_SLICE",
    "SHARE_BASE",
    "SHARE_TAG",
    "SHARE_UNITS",
    "SLICE_BASE",
    "SLICE_TAG",
    "GpuModel",
    "LayoutError",
    "Placement",
    "Profile",
    "device_gpu",
    "device_kind",
    "device_label",
    "device_labels",
    "free_starts",
    "is_share_model",
    "is_slice_model",
    "layout_words",
    "model_for",
    "parse_layout",
    "physical_node",
    "place_layout",
    "share_gpu_type",
    "share_index",
    "share_model",
    "share_node",
    "share_of",
    "slice_gpu_type",
    "slice_index",
    "slice_model",
    "slice_node",
    "slice_of",
    "slice_parent_model",
    "slice_share",
    "slice_share_of",
    "smallest_fitting",
    "wanted_kind",
    "wants_share",
    "wants_slices",
]
