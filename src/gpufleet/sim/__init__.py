"""The trace-driven simulator: replays job traces through the unchanged scheduling core."""

from gpufleet.sim.config import FleetSpec, JobOutcome, SimConfig, SimResult
from gpufleet.sim.engine import Simulator
from gpufleet.sim.runner import Comparison, bounds, compare_policies
from gpufleet.sim.trace import TraceError, TraceJob, TraceLoad, TraceProblem, offered_load

__all__ = [
    "Comparison",
    "FleetSpec",
    "JobOutcome",
    "SimConfig",
    "SimResult",
    "Simulator",
    "TraceError",
    "TraceJob",
    "TraceLoad",
    "TraceProblem",
    "bounds",
    "compare_policies",
    "offered_load",
]
