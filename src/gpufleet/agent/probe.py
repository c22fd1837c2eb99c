"""The GPU probe seam: what a node has (inventory) and how it is doing (telemetry).

Two probes implement ``GpuProbe``: ``NvmlProbe`` (real GPUs, through NVML in-process)
and ``SimulatedProbe`` (no GPU: plausible numbers that follow the load placed on each
GPU, with fault injection for tests and the demo). A field a GPU does not support is
``None``; a failure of the probe as a whole is a ``ProbeError``.

``gpu_health`` turns a sample into a verdict (healthy or not, and why); the agent
reports unhealthy GPUs to the server so nothing new is placed on them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class ProbeError(Exception):
    """The probe cannot read the GPUs at all (no driver, no library, NVML failure)."""


class MigError(ProbeError):
    """A MIG layout was not applied: MIG mode off, an illegal layout, instances in use,
    no permission, or NVML refusing; the message says which, for the operator."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MigInstance:
    """One MIG device: a compute instance inside a GPU instance, as NVML reports it."""

    uuid: str
    """``MIG-...``: what ``CUDA_VISIBLE_DEVICES`` takes."""
    profile: str
    """The GPU instance's profile, e.g. ``1g.10gb`` (``gpufleet.mig`` names)."""
    gpu_instance_id: int
    compute_instance_id: int
    start: int
    """First memory slice of the GPU instance's placement."""
    size: int
    """Memory slices the placement occupies."""
    memory_mb: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One GPU as inventory: what it is and how it is wired."""

    index: int
    uuid: str
    model: str
    memory_mb: int
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlink_peers: tuple[int, ...] = ()
    """Indices of local GPUs reachable over NVLink (directly or through an NVSwitch)."""
    nvlink_domain: int = 0
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    """The MIG devices on this GPU, by placement start (empty unless MIG mode is on)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInventory:
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None = None
    cuda_version: str | None = None
    cpus: int | None = None
    """CPUs jobs may use on this node (the agent's affinity mask); None: unknown."""
    memory_mb: int | None = None
    """The node's memory in MiB; None: unknown."""


def host_resources() -> tuple[int | None, int | None]:
    """(CPUs, memory in MiB) of this machine: the CPUs this process may run on (a
    cpuset or ``taskset`` narrows them), else all of them; psutil's total memory."""
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count()
    try:
        import psutil

        memory: int | None = int(psutil.virtual_memory().total) // (1024 * 1024)
    except Exception:  # no psutil on this platform, or /proc unreadable
        memory = None
    return cpus, memory


class HostProbe:
    """A node without GPUs (a CPU-only pool's: preprocessing, data loading): it reports
    this machine's CPUs and memory and no GPU, and needs no NVIDIA driver
    (``gpufleet agent --cpu-only``)."""

    def inventory(self) -> NodeInventory:
        cpus, memory = host_resources()
        return NodeInventory(gpus=(), cpus=cpus, memory_mb=memory)

    def sample(self) -> tuple[GpuSample, ...]:
        return ()

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True, kw_only=True)
class MigSample:
    """One MIG instance's memory at one moment (NVML's memory info on the MIG device's
    handle: its GPU instance's memory, which the instance's compute instances share).

    No utilisation: NVML reports none per MIG instance (``nvmlDeviceGetUtilizationRates``
    is not supported on a MIG device, nor on its parent in MIG mode); dcgm-exporter gets
    it from DCGM's profiling counters (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``), which gpufleet
    does not read. A reading the device does not give is None, never an estimate."""

    gpu_instance_id: int
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    """One GPU's telemetry at one moment. ``xid_events`` are the XID codes seen since
    the previous sample; the ECC and PCIe replay counters are cumulative."""

    index: int
    utilization_pct: float | None = None
    memory_used_mb: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_sbe: int | None = None
    ecc_dbe: int | None = None
    xid_events: tuple[int, ...] = ()
    pcie_replay: int | None = None
    retired_pages: int | None = None
    """Pages retired for ECC errors (single- plus double-bit), cumulative."""
    lost: bool = False
    mig_instances: tuple[MigSample, ...] = ()
    """Per MIG instance of a GPU in MIG mode, by GPU instance id (empty otherwise)."""
    pcie_gen: int | None = None
    """The PCIe link now (a GPU lowers its generation when idle); ``pcie_max_*``: the
    most the GPU and its slot can do (``gpufleet.gpuchecks``)."""
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    nvlink_down: tuple[int, ...] = ()
    """NVLink links the GPU supports that are inactive."""
    ecc_enabled: bool | None = None
    """ECC mode now and after the next reboot (None: the GPU has no ECC)."""
    ecc_pending: bool | None = None


@runtime_checkable
class GpuProbe(Protocol):
    def inventory(self) -> NodeInventory: ...

    def sample(self) -> tuple[GpuSample, ...]: ...

    def close(self) -> None: ...


@runtime_checkable
class ProcessProbe(Protocol):
    """A probe that can list the compute processes on a GPU (``NvmlProbe``): after a job's
    end the agent kills what of its account is still on its GPUs (``Agent.tick``)."""

    def gpu_pids(self, gpu_index: int) -> tuple[int, ...]: ...


@runtime_checkable
class LoadSink(Protocol):
    """A probe that can be told what runs on each GPU (the simulated one): the agent
    tells it after every reconcile so telemetry follows the jobs."""

    def set_load(self, load: dict[int, float]) -> None: ...


# XIDs that mean the GPU should take no new work until someone looks at it
# (NVIDIA's XID catalogue: 48 DBE, 63/64 row remapping, 74 NVLink, 79 fell off the bus,
# 92 high SBE rate, 94/95 contained/uncontained ECC, 119/120 GSP errors).
CRITICAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthLimits:
    max_temperature_c: float = 90.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    healthy: bool
    reasons: tuple[str, ...] = ()


def gpu_health(sample: GpuSample, limits: HealthLimits = HealthLimits()) -> Verdict:
    """Pure: the faults this one sample shows."""
    reasons: list[str] = []
    if sample.lost:
        reasons.append("gpu lost")
    if sample.temperature_c is not None and sample.temperature_c >= limits.max_temperature_c:
        reasons.append(f"overheat {sample.temperature_c:.0f}C")
    bad_xids = sorted({x for x in sample.xid_events if x in CRITICAL_XIDS})
    if bad_xids:
        reasons.append("xid " + ",".join(map(str, bad_xids)))
    if sample.ecc_dbe:
        reasons.append(f"ecc double-bit {sample.ecc_dbe}")
    return Verdict(healthy=not reasons, reasons=tuple(reasons))


@dataclass(slots=True)
class HealthTracker:
    """Faults that do not clear by themselves (XID, double-bit ECC, lost) stay until the
    agent restarts; an overheat clears when the GPU cools down."""

    limits: HealthLimits = field(default_factory=HealthLimits)
    _sticky: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def update(self, samples: Sequence[GpuSample]) -> dict[int, Verdict]:
        out: dict[int, Verdict] = {}
        for s in samples:
            v = gpu_health(s, self.limits)
            sticky = tuple(r for r in v.reasons if not r.startswith("overheat"))
            if sticky:
                self._sticky[s.index] = tuple(dict.fromkeys(self._sticky.get(s.index, ()) + sticky))
            reasons = tuple(dict.fromkeys(self._sticky.get(s.index, ()) + v.reasons))
            out[s.index] = Verdict(healthy=not reasons, reasons=reasons)
        return out


def nvlink_domains(peers: Mapping[int, Sequence[int]]) -> dict[int, int]:
    """Connected components of the NVLink graph, numbered by their lowest GPU index in
    order (GPUs without NVLink each get their own domain)."""
    parent = {i: i for i in peers}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, ps in peers.items():
        for p in ps:
            if p in parent:
                a, b = find(i), find(p)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    roots = sorted({find(i) for i in peers})
    number = {r: n for n, r in enumerate(roots)}
    return {i: number[find(i)] for i in peers}
