"""What a sync reports of the node itself, as the server's schema (``gpufleet.api.nodes``)
takes it: each GPU (``GpuIn``, with the agent's health verdict and its MIG devices), its
telemetry, and the node's own facts (where it sits, its features, driver, CPUs, memory,
what it cannot enforce). Strings are cut to the schema's limits here: one odd name from
a driver must not get the whole sync refused. The jobs, logs, steps and MIG results of
a sync are the agent's (``agent.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.probe import GpuInfo, GpuSample, MigInstance, NodeInventory

MIG_INSTANCES_MAX = 7
"""``GpuIn.mig_instances``' limit (no GPU has more MIG devices)."""


def telemetry_row(s: GpuSample, reasons: tuple[str, ...], inv: NodeInventory) -> dict[str, Any]:
    info = next((g for g in inv.gpus if g.index == s.index), None)
    row: dict[str, Any] = {
        "index": s.index,
        "utilization_pct": s.utilization_pct,
        "memory_used_mb": s.memory_used_mb,
        "temperature_c": s.temperature_c,
        "power_w": s.power_w,
        "sm_clock_mhz": s.sm_clock_mhz,
        "mem_clock_mhz": s.mem_clock_mhz,
        "throttle_reasons": list(s.throttle_reasons),
        "ecc_sbe": s.ecc_sbe,
        "ecc_dbe": s.ecc_dbe,
        "xid_events": list(s.xid_events),
        "pcie_replay": s.pcie_replay,
        "retired_pages": s.retired_pages,
        "pcie_gen": s.pcie_gen if s.pcie_gen is not None else info.pcie_gen if info else None,
        "pcie_width": s.pcie_width if s.pcie_width is not None else info.pcie_width if info else None,
        "nvlink_peers": list(info.nvlink_peers) if info else [],
        "mig_enabled": info.mig_enabled if info else None,
        "lost": s.lost,
        "health": list(reasons),
    }
    for key in ("pcie_max_gen", "pcie_max_width", "ecc_enabled", "ecc_pending"):  # issue 34's checks
        if getattr(s, key) is not None:  # only then: an older server refuses the key
            row[key] = getattr(s, key)
    if s.nvlink_down:
        row["nvlink_down"] = list(s.nvlink_down[:64])
    if s.mig_instances:  # only then: an older server refuses the key (extra="forbid")
        row["mig_instances"] = [dataclasses.asdict(m) for m in s.mig_instances[:7]]
    return row


def mig_instance_row(m: MigInstance) -> dict[str, Any]:
    """A MIG device as ``MigInstanceIn`` (strings cut to its limits: one odd name from a
    driver must not get the whole sync refused)."""
    return {
        "uuid": m.uuid[:96],
        "profile": m.profile[:32],
        "gpu_instance_id": m.gpu_instance_id,
        "compute_instance_id": m.compute_instance_id,
        "start": m.start,
        "size": m.size,
        "memory_mb": m.memory_mb,
    }


def gpu_row(g: GpuInfo, healthy: bool) -> dict[str, Any]:
    """A GPU of the inventory as ``GpuIn``."""
    return {
        "index": g.index,
        "uuid": g.uuid[:64],
        "model": g.model[:64],
        "memory_mb": g.memory_mb,
        "nvlink_domain": g.nvlink_domain,
        "healthy": healthy,
        "mig_enabled": g.mig_enabled,
        "mig_instances": [mig_instance_row(m) for m in g.mig_instances[:MIG_INSTANCES_MAX]],
    }


def node_facts(config: AgentConfig, inv: NodeInventory, warning: str | None) -> dict[str, Any]:
    """The node's own fields of a sync, each only where it is set or known."""
    body: dict[str, Any] = {}
    for k in ("leaf", "rack", "address"):
        v = getattr(config, k)
        if v:
            body[k] = v
    if config.features:
        body["features"] = list(config.features)
    if inv.driver_version:
        body["driver_version"] = inv.driver_version[:64]
    if inv.cuda_version:
        body["cuda_version"] = inv.cuda_version[:32]
    if inv.cpus is not None:
        body["cpus"] = inv.cpus
    if inv.memory_mb is not None:
        body["memory_mb"] = inv.memory_mb
    if warning:
        body["warning"] = warning[:512]
    return body
