"""The gpufleet node agent (``gpufleet agent``): GPU inventory and telemetry through
NVML (or a simulated probe), jobs run as processes, containers or simulations on
exactly their GPUs, everything reconciled with the server by ``Agent.sync_once``.

Seams (each a Protocol with an in-package fake or double): ``GpuProbe``
(``NvmlProbe`` / ``SimulatedProbe``), ``JobRunner`` (``ProcessRunner``,
``ContainerRunner``, ``SimulatedRunner``), ``SyncTransport`` (``HttpTransport``; tests
pass httpx's ``MockTransport`` to it), the clock (``gpufleet.server.clock``).

Errors: ``ProbeError`` (the GPUs cannot be read at all) and ``AgentTransportError``
(the server could not be reached or refused; ``.status`` when it answered).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.agent import Agent, AgentConfig, AgentStats, read_chunk
from gpufleet.agent.container import ContainerRunner, ContainerSpec, container_spec
from gpufleet.agent.jobs import SIMULATE_ENV, JobSpec, JobStore, LocalJob, launch_env
from gpufleet.agent.nvml import NvmlProbe
from gpufleet.agent.probe import (
    GpuInfo,
    GpuProbe,
    GpuSample,
    HealthTracker,
    NodeInventory,
    ProbeError,
    Verdict,
    gpu_health,
)
from gpufleet.agent.runners import JobRunner, ProcessRunner, SimulatedRunner
from gpufleet.agent.simprobe import SimSpec, SimulatedProbe
from gpufleet.agent.transport import AgentTransportError, HttpTransport, SyncTransport
from gpufleet.server.clock import Clock


def make_agent(
    *,
    config: AgentConfig,
    probe: GpuProbe,
    transport: SyncTransport,
    clock: Clock | None = None,
    container_caps: tuple[str, ...] = (),
    container_runtime: str | None = None,
) -> Agent:
    """An agent with the standard runners over ``config.work_dir``."""
    store = JobStore(Path(config.work_dir), checkpoints=config.checkpoint_root)
    runners: dict[str, JobRunner] = {
        "process": ProcessRunner(store, node=config.node),
        "simulated": SimulatedRunner(store),
        "container": ContainerRunner(
            store, node=config.node, allowed_caps=container_caps, runtime=container_runtime
        ),
    }
    return Agent(config=config, probe=probe, transport=transport, runners=runners, store=store, clock=clock)


__all__ = [
    "SIMULATE_ENV",
    "Agent",
    "AgentConfig",
    "AgentStats",
    "AgentTransportError",
    "ContainerRunner",
    "ContainerSpec",
    "GpuInfo",
    "GpuProbe",
    "GpuSample",
    "HealthTracker",
    "HttpTransport",
    "JobRunner",
    "JobSpec",
    "JobStore",
    "LocalJob",
    "NodeInventory",
    "NvmlProbe",
    "ProbeError",
    "ProcessRunner",
    "SimSpec",
    "SimulatedProbe",
    "SimulatedRunner",
    "SyncTransport",
    "Verdict",
    "container_spec",
    "gpu_health",
    "launch_env",
    "make_agent",
    "read_chunk",
]
