"""How the scheduler and the agents name MIG slices (stdlib only, cheap to import: the
CLI's ``queue`` shows slice indices with it). ``gpufleet.mig`` re-exports all of it.

Kubernetes' "mixed" MIG strategy: each profile is a resource of its own
(nvidia.com/mig-1g.10gb), counted like GPUs. gpufleet does the same: the server shows the
scheduling core, beside each node's whole GPUs, one node per (node, profile) whose "GPUs"
are that profile's MIG instances ("n1:1g.10gb", model "H100-80GB MIG 1g.10gb"); a job
asks for them by GPU type ("MIG 1g.10gb"). A slice never splits (it is one device), a job's
slices are on one node (a slice request is one node's), and a MIG GPU is never handed out
whole. An allocation stores the physical node and the slice's index: SLICE_BASE + GPU x 8
+ its placement's first memory slice, which never meets a GPU index (< SLICE_BASE).
"""

from __future__ import annotations

import re
from typing import Final

MEMORY_SLICES: Final = 8
"""Memory slices of a MIG-capable GPU (placements start at 0..7)."""
SLICE_BASE: Final = 1024
"""Slice indices start here (GPU indices are below: ``api.base.MAX_GPU_INDEX``)."""
SLICE_TAG: Final = "MIG"
PROFILE_NAME: Final = re.compile(r"(?P<g>[1-8])g\.(?P<gb>[1-9][0-9]*)gb(?P<me>\+me)?")
"""A MIG profile's name as NVIDIA writes it (lower case): ``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``."""


def slice_index(gpu: int, start: int) -> int:
    """The index of the MIG instance of GPU ``gpu`` placed at memory slice ``start``."""
    if not 0 <= start < MEMORY_SLICES or gpu < 0:
        raise ValueError(f"no MIG instance at GPU {gpu}, memory slice {start}")
    return SLICE_BASE + gpu * MEMORY_SLICES + start


def slice_of(index: int) -> tuple[int, int] | None:
    """(GPU, first memory slice) of a slice index; None for a whole GPU's index."""
    if index < SLICE_BASE:
        return None
    gpu, start = divmod(index - SLICE_BASE, MEMORY_SLICES)
    return gpu, start


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
    """The GPU an allocated index is on: itself, or a slice's GPU."""
    found = slice_of(index)
    return index if found is None else found[0]


def device_label(index: int) -> str:
    """How the CLI shows an allocated index: ``3`` for GPU 3, ``mig1.4`` for the MIG slice
    of GPU 1 placed at memory slice 4."""
    found = slice_of(index)
    return str(index) if found is None else f"mig{found[0]}.{found[1]}"


def slice_parent_model(model: str) -> str:
    """The GPU model of a slice model ("H100-80GB MIG 1g.10gb" -> "H100-80GB"); a whole
    GPU's model as it is."""
    head, sep, _ = model.partition(f" {SLICE_TAG} ")
    return head if sep else model


def slice_share_of(model: str) -> float:
    """The share of its GPU a slice of this model is billed and charged energy for:
    compute slices / 7 (a 1g.* slice 1/7, a 7g.* 1); 1.0 for a whole GPU's model."""
    _, sep, profile = model.partition(f" {SLICE_TAG} ")
    m = PROFILE_NAME.fullmatch(profile) if sep else None
    return 1.0 if m is None else min(1.0, int(m["g"]) / 7)
