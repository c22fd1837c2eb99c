"""How the scheduler and the agents name MIG slices and GPU shares (stdlib only, cheap to
import: the CLI's ``queue`` shows slice indices with it). ``gpufleet.mig`` re-exports all
of it.

Kubernetes' "mixed" MIG strategy: each profile is a resource of its own
(nvidia.com/mig-1g.10gb), counted like GPUs. gpufleet does the same: the server shows the
scheduling core, beside each node's whole GPUs, one node per (node, profile) whose "GPUs"
are that profile's MIG instances ("n1:1g.10gb", model "H100-80GB MIG 1g.10gb"); a job
asks for them by GPU type ("MIG 1g.10gb"). A slice never splits (it is one device), a job's
slices are on one node (a slice request is one node's), and a MIG GPU is never handed out
whole. An allocation stores the physical node and the slice's index: SLICE_BASE + GPU x 8
+ its placement's first memory slice, which never meets a GPU index (< SLICE_BASE).

GPU shares (sharing without MIG, under MPS or time-slicing) work the same way: a GPU an
operator marks shared leaves its node's whole GPUs and becomes one scheduler node of its
own ("n1:share3") holding ``SHARE_UNITS`` units, each 1 % of the GPU's compute and memory
(model "H100-80GB SHARED"); a job asking ``--gpu-fraction 0.25`` asks 25 units of GPU type
"SHARED" on one node, so its units are on one GPU. A unit's index is SHARE_BASE + GPU x
SHARE_UNITS + unit (above every slice index). Quotas and fair share count a share job's
units as ``units / SHARE_UNITS`` GPUs (``JobRequest.units``).
"""

from __future__ import annotations

import re
from typing import Final

MEMORY_SLICES: Final = 8
"""Memory slices of a MIG-capable GPU (placements start at 0..7)."""
SLICE_BASE: Final = 1024
"""Slice indices start here (GPU indices are below: ``api.base.MAX_GPU_INDEX``)."""
SLICE_TAG: Final = "MIG"
SHARE_BASE: Final = 16384
"""Share unit indices start here (above every slice index: SLICE_BASE + 1024 x 8)."""
SHARE_UNITS: Final = 100
"""Units of a shared GPU: a unit is 1 % of its compute (MPS's active thread percentage)
and of its memory."""
SHARE_TAG: Final = "SHARED"
PROFILE_NAME: Final = re.compile(r"(?P<g>[1-8])g\.(?P<gb>[1-9][0-9]*)gb(?P<me>\+me)?")
"""A MIG profile's name as NVIDIA writes it (lower case): ``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``."""


def slice_index(gpu: int, start: int) -> int:
    """The index of the MIG instance of GPU ``gpu`` placed at memory slice ``start``."""
    if not 0 <= start < MEMORY_SLICES or gpu < 0:
        raise ValueError(f"no MIG instance at GPU {gpu}, memory slice {start}")
    return SLICE_BASE + gpu * MEMORY_SLICES + start


def slice_of(index: int) -> tuple[int, int] | None:
    """(GPU, first memory slice) of a slice index; None for a whole GPU's index."""
    if not SLICE_BASE <= index < SHARE_BASE:
        return None
    gpu, start = divmod(index - SLICE_BASE, MEMORY_SLICES)
    return gpu, start


def share_index(gpu: int, unit: int) -> int:
    """The index of unit ``unit`` of shared GPU ``gpu``."""
    if not 0 <= unit < SHARE_UNITS or gpu < 0:
        raise ValueError(f"no share unit {unit} of GPU {gpu}")
    return SHARE_BASE + gpu * SHARE_UNITS + unit


def share_of(index: int) -> tuple[int, int] | None:
    """(GPU, unit) of a share unit's index; None for a GPU's or a slice's index."""
    if index < SHARE_BASE:
        return None
    gpu, unit = divmod(index - SHARE_BASE, SHARE_UNITS)
    return gpu, unit


def share_node(node: str, gpu: int) -> str:
    """The scheduler's node of shared GPU ``gpu`` of ``node``."""
    return f"{node}:share{gpu}"


def share_model(gpu_model: str) -> str:
    """The GPU model the scheduler sees for a shared GPU's units: "H100-80GB SHARED"."""
    return f"{gpu_model} {SHARE_TAG}"


def is_share_model(model: str) -> bool:
    return model.endswith(f" {SHARE_TAG}")


def wants_share(gpu_type: str | None) -> bool:
    """Whether a job's GPU type asks for a GPU share ("SHARED", "H100 SHARED")."""
    return gpu_type is not None and SHARE_TAG.lower() in gpu_type.lower().replace("-", " ").split()


def gpus_label(gpus: int, gpu_type: str | None) -> str:
    """How the CLI shows a job's GPUs: ``2``, or a share's part of one GPU, ``0.25``."""
    return f"{gpus / SHARE_UNITS:g}" if wants_share(gpu_type) else str(gpus)


def share_gpu_type(gpu_type: str | None = None) -> str:
    """The GPU type of a share of ``gpu_type`` GPUs (any model: "SHARED")."""
    return SHARE_TAG if not gpu_type else f"{gpu_type} {SHARE_TAG}"


def device_kind(model: str) -> str:
    """ "slice", "share" or "gpu": what a scheduler node's devices are."""
    return "slice" if is_slice_model(model) else "share" if is_share_model(model) else "gpu"


def wanted_kind(gpu_type: str | None) -> str:
    """The ``device_kind`` a job's GPU type asks for."""
    return "slice" if wants_slices(gpu_type) else "share" if wants_share(gpu_type) else "gpu"


def slice_node(node: str, profile: str) -> str:
    """The scheduler's node of ``node``'s ``profile`` slices (":" is in no node's name)."""
    return f"{node}:{profile}"


def physical_node(name: str) -> str:
    """The node a scheduler node is (itself, or the node of a slice node)."""
    return name.partition(":")[0]


def slice_model(gpu_model: str, profile: str) -> str:
    """The GPU model the scheduler sees for a profile's slices: "H100-80GB MIG 1g.10gb"."""
    return f"{gpu_model} {SLICE_TAG} {profile}"


def is_slice_model(model: str) -> bool:
    return f" {SLICE_TAG} " in model


def wants_slices(gpu_type: str | None) -> bool:
    """Whether a job's GPU type asks for MIG slices ("MIG 1g.10gb", "H100 MIG 3g.40gb")."""
    return gpu_type is not None and SLICE_TAG.lower() in gpu_type.lower().replace("-", " ").split()


def slice_gpu_type(profile: str) -> str:
    """The GPU type a job asks with for ``profile`` slices (``--mig 1g.10gb``)."""
    return f"{SLICE_TAG} {profile}"


def device_gpu(index: int) -> int:
    """The GPU an allocated index is on: itself, or a slice's or share unit's GPU."""
    found = slice_of(index) or share_of(index)
    return index if found is None else found[0]


def device_label(index: int) -> str:
    """How the CLI shows an allocated index: ``3`` for GPU 3, ``mig1.4`` for the MIG slice
    of GPU 1 placed at memory slice 4 (a share's units, together: ``device_labels``)."""
    found = slice_of(index)
    return str(index) if found is None else f"mig{found[0]}.{found[1]}"


def device_labels(indices: list[int] | tuple[int, ...]) -> list[str]:
    """How the CLI shows a node's allocated indices: a share's units as ``3@25%`` (25 units
    of GPU 3), the rest one label each."""
    shares: dict[int, int] = {}
    out: list[str] = []
    for i in sorted(indices):
        s = share_of(i)
        if s is None:
            out.append(device_label(i))
        else:
            shares[s[0]] = shares.get(s[0], 0) + 1
    return out + [f"{g}@{n * 100 // SHARE_UNITS}%" for g, n in sorted(shares.items())]


def slice_parent_model(model: str) -> str:
    """The GPU model of a slice model ("H100-80GB MIG 1g.10gb" -> "H100-80GB"); a whole
    GPU's model as it is."""
    if is_share_model(model):
        return model[: -len(SHARE_TAG) - 1]
    head, sep, _ = model.partition(f" {SLICE_TAG} ")
    return head if sep else model


def slice_share_of(model: str) -> float:
    """The share of its GPU a slice of this model is billed and charged energy for:
    compute slices / 7 (a 1g.* slice 1/7, a 7g.* 1); a share unit 1 / SHARE_UNITS; 1.0
    for a whole GPU's model."""
    if is_share_model(model):
        return 1 / SHARE_UNITS
    _, sep, profile = model.partition(f" {SLICE_TAG} ")
    m = PROFILE_NAME.fullmatch(profile) if sep else None
    return 1.0 if m is None else min(1.0, int(m["g"]) / 7)


def layout_words(profiles: list[str] | tuple[str, ...]) -> str:
    """A MIG layout in few words, each profile once with its count, in the layout's
    order: ``1g.10gb x7``, ``2g.20gb x2, 3g.40gb``; ``whole GPU`` for the empty layout
    (MIG off). What the CLI, the demo and wait reasons print."""
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p] = counts.get(p, 0) + 1
    if not counts:
        return "whole GPU"
    return ", ".join(p if n == 1 else f"{p} x{n}" for p, n in counts.items())
