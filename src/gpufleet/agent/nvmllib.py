"""The boundary to the NVML library (``nvidia-ml-py``'s ``pynvml``): loading it, its
return codes, and how its errors translate, here and nowhere else: a field the GPU does
not support (or this driver does not know) is ``None`` (``field``); a GPU that fell off
the bus is ``GpuLost`` (the probe makes it a sample with ``lost=True``); anything else is
a ``ProbeError``. ``lib`` is the ``pynvml`` module or anything with the same functions,
constants and ``NVMLError`` (with ``.value``): tests pass a fake.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from gpufleet.agent.probe import ProbeError

T = TypeVar("T")

# NVML return codes (nvml.h); kept here so a fake library need not define them all.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
INVALID_ARGUMENT = 2

UNSUPPORTED = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND})


class GpuLost(Exception):
    """The GPU fell off the bus (``NVML_ERROR_GPU_IS_LOST``)."""


def text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def load_nvml() -> Any:
    """Import ``pynvml`` (nvidia-ml-py), or say clearly why not."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise ProbeError(
            "NVML bindings are not installed (pip install nvidia-ml-py); "
            "on a machine without GPUs run the agent with --simulate-gpus N"
        ) from exc


def code(exc: BaseException) -> int | None:
    """An ``NVMLError``'s return code (None when it carries none)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def call(lib: Any, fn: Callable[..., T], *args: Any, what: str) -> T:
    """A call that must succeed: any NVML error is a ``ProbeError`` saying what failed."""
    try:
        return fn(*args)
    except lib.NVMLError as exc:
        raise ProbeError(f"NVML: cannot {what}: {exc}") from exc


def field(lib: Any, fn: Callable[..., T], *args: Any, missing: int | None = None) -> T | None:
    """One optional field: None when unsupported (or the ``missing`` code: e.g. an
    empty MIG device index); ``GpuLost`` when the GPU is gone."""
    try:
        return fn(*args)
    except lib.NVMLError as exc:
        got = code(exc)
        if got in UNSUPPORTED or got == INVALID_ARGUMENT or (missing is not None and got == missing):
            return None
        if got == GPU_IS_LOST:
            raise GpuLost from exc
        raise ProbeError(f"NVML: {getattr(fn, '__name__', 'call')} failed: {exc}") from exc
