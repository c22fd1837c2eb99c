"""Trace loaders, one module per format, registered in ``LOADERS`` by format name.

Every loader follows one contract: rows it cannot use (a missing field, a bad number or
timestamp, no GPUs, a non-positive duration, a duplicate id) become ``TraceProblem`` s
with their 1-based physical line and are skipped; only a file that cannot be read as a
whole (missing, undecodable, no usable header) raises ``TraceError``. Jobs come back
sorted by (submit_s, job_id), rebased so the earliest submit is 0.0.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.sim.loaders.alibaba import load_alibaba
from gpufleet.sim.loaders.gpufleet_csv import load_gpufleet_csv, write_gpufleet_csv
from gpufleet.sim.loaders.helios import load_helios
from gpufleet.sim.loaders.openb import load_openb
from gpufleet.sim.loaders.philly import load_philly
from gpufleet.sim.loaders.sacct import load_sacct
from gpufleet.sim.trace import Loader, TraceError, TraceLoad

LOADERS: dict[str, Loader] = {
    "gpufleet": load_gpufleet_csv,
    "philly": load_philly,
    "helios": load_helios,
    "alibaba": load_alibaba,
    "sacct": load_sacct,
    "openb": load_openb,
}


def load_trace(path: Path, fmt: str) -> TraceLoad:
    """Load ``path`` with the loader registered as ``fmt``."""
    loader = LOADERS.get(fmt)
    if loader is None:
        raise TraceError(f"unknown trace format {fmt!r}; known formats: {', '.join(LOADERS)}")
    if not path.exists():
        raise TraceError(f"trace file not found: {path}")
    if not path.is_file():
        raise TraceError(f"trace path is not a file: {path}")
    return loader(path)


__all__ = ["LOADERS", "Loader", "TraceError", "TraceLoad", "load_trace", "write_gpufleet_csv"]
