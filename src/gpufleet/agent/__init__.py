"""The gpufleet node agent (``gpufleet agent``): GPU inventory and telemetry through
NVML (or a simulated probe), jobs run as processes, containers or simulations on
exactly their GPUs, everything reconciled with the server by ``Agent.sync_once``.

Seams (each a Protocol with an in-package fake or double): ``GpuProbe``
(``NvmlProbe`` / ``SimulatedProbe``), ``JobRunner`` (``ProcessRunner``,
``ContainerRunner``, ``SimulatedRunner``), ``SyncTransport`` (``HttpTransport``; tests
pass httpx's ``MockTransport`` to it), the clock (``gpufleet.clock``).

Errors: ``ProbeError`` (the GPUs cannot be read at all) and ``AgentTransportError``
(the server could not be reached or refused; ``.status`` when it answered).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.agent import Agent
from gpufleet.agent.cgroups import Cgroups, Limits
from gpufleet.agent.config import AgentConfig, AgentStats
from gpufleet.agent.container import ContainerPolicy, ContainerRunner, ContainerSpec, container_spec
from gpufleet.agent.jobs import SIMULATE_ENV, JobSpec, JobStore, LocalJob, launch_env
from gpufleet.agent.logship import LogLimits, read_chunk
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
from gpufleet.agent.users import FakeAccounts, PosixAccount, Refusal, RunAs, SystemAccounts, UserMap
from gpufleet.clock import Clock


def make_agent(
    *,
    config: AgentConfig,
    probe: GpuProbe,
    transport: SyncTransport,
    clock: Clock | None = None,
    run_as: RunAs | None = None,
    cgroups: Cgroups | None = None,
    limits: Limits = Limits(),
    container_policy: ContainerPolicy = ContainerPolicy(),
) -> Agent:
    """An agent with the standard runners over ``config.work_dir``; jobs run as their
    owners as ``run_as`` resolves them (default: the node's accounts, same names)."""
    store = JobStore(Path(config.work_dir), checkpoints=config.checkpoint_root)
    run_as = run_as or RunAs(node=config.node)
    runners: dict[str, JobRunner] = {
        "process": ProcessRunner(store, node=config.node, run_as=run_as, cgroups=cgroups, limits=limits),
        "simulated": SimulatedRunner(store),
        "container": ContainerRunner(store, node=config.node, policy=container_policy, run_as=run_as),
    }
    return Agent(
        config=config,
        probe=probe,
        transport=transport,
        runners=runners,
        store=store,
        clock=clock,
        warning=None if cgroups is None else lambda: cgroups.disabled_reason,
    )


__all__ = [
    "SIMULATE_ENV",
    "Agent",
    "AgentConfig",
    "AgentStats",
    "AgentTransportError",
    "Cgroups",
    "ContainerPolicy",
    "ContainerRunner",
    "ContainerSpec",
    "FakeAccounts",
    "GpuInfo",
    "GpuProbe",
    "GpuSample",
    "HealthTracker",
    "HttpTransport",
    "JobRunner",
    "JobSpec",
    "JobStore",
    "Limits",
    "LocalJob",
    "LogLimits",
    "NodeInventory",
    "NvmlProbe",
    "PosixAccount",
    "ProbeError",
    "ProcessRunner",
    "Refusal",
    "RunAs",
    "SimSpec",
    "SimulatedProbe",
    "SimulatedRunner",
    "SyncTransport",
    "SystemAccounts",
    "UserMap",
    "Verdict",
    "container_spec",
    "gpu_health",
    "launch_env",
    "make_agent",
    "read_chunk",
]
