"""CUDA versions as the fleet compares them: a job's need (``submit --cuda 12.4``) and a
node's driver (the newest CUDA it supports: NVML's ``nvmlSystemGetCudaDriverVersion``,
``nvidia-smi``'s "CUDA Version").

A version is (major, minor): ``12.4``, ``12`` (12.0) or ``12.4.1`` (the patch level is
dropped: a driver supports a minor version whole, NVIDIA's "CUDA minor version
compatibility"). Anything else is refused with the reason, never guessed: ``abc``,
``1e9``, ``12.x``, a major beyond ``MAX_MAJOR``. Pure, importable by every process
(the API's validators, the agent, the core, the simulator).
"""

from __future__ import annotations

import re

__all__ = ["MAX_MAJOR", "CudaVersion", "at_least", "format_cuda", "parse_cuda", "parse_reported"]

CudaVersion = tuple[int, int]
MAX_MAJOR = 99
"""No CUDA major version above this (CUDA 12 in 2024): a larger one is a typo, refused."""

_VERSION = re.compile(r"^(\d{1,2})(?:\.(\d{1,3}))?(?:\.\d{1,4})?$")


def parse_cuda(text: str) -> CudaVersion:
    """``"12.4"`` -> (12, 4); ``ValueError`` saying what is wrong otherwise."""
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"CUDA version {text[:40]!r}: expected MAJOR.MINOR such as 12.4")
    major, minor = int(m.group(1)), int(m.group(2) or 0)
    if not 1 <= major <= MAX_MAJOR:
        raise ValueError(f"CUDA version {text[:40]!r}: the major version must be 1..{MAX_MAJOR}")
    return major, minor


def parse_reported(text: str | None) -> CudaVersion | None:
    """What a node's agent reported (``NodeSync.cuda_version``), or None when it reported
    nothing or nothing readable (such a node supports no declared CUDA version)."""
    if not text:
        return None
    try:
        return parse_cuda(text)
    except ValueError:
        return None


def format_cuda(v: CudaVersion) -> str:
    return f"{v[0]}.{v[1]}"


def at_least(have: CudaVersion | None, need: CudaVersion) -> bool:
    """A driver that supports CUDA ``have`` runs code built for ``need``."""
    return have is not None and have >= need
