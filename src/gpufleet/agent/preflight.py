"""The agent's preflight: what it checks of its node before it takes work, at start and
after a driver upgrade (``preflight(probe)``; the upgrade's verification calls it too),
in the spirit of DCGM's quick diagnostic (``dcgmi diag -r 1``: software, then the GPUs'
health) and of the GPU Operator's validator.

Checks, each a ``Finding`` when it does not pass:

==============  =========  ===========================================================
check           severity   fails when
==============  =========  ===========================================================
``nvml``        fatal      the probe cannot read the GPUs (no driver, NVML failing)
``driver``      fatal      the driver is not the one expected (``expect_driver``)
``driver``      warning    a GPU node reports no driver or CUDA version
``gpu_lost``    fatal      a GPU fell off the bus
``temperature`` fatal      at or above ``max_temp_c`` (85 C) while the node is idle
``ecc_dbe``     fatal      volatile double-bit ECC errors
``xid``         fatal      a critical XID (``probe.CRITICAL_XIDS``)
``ecc_mode``    fatal      ECC off on a GPU that supports it (``require_ecc``)
``ecc_pending`` warning    an ECC mode change waits for a reboot
``pcie``        fatal      the link's width below the GPU's and slot's max (the
                           generation only under load: an idle GPU lowers it;
                           ``gpufleet.gpuchecks``)
``nvlink``      fatal      NVLink links down
==============  =========  ===========================================================

The findings go up with the next sync (``NodeSync.preflight``, until a sync is
answered): the server cordons the node with the fatal ones' reasons and records the
warnings as events; it uncordons nothing by itself (an operator does, once fixed).
Pure but for the probe's two reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from gpufleet import gpuchecks
from gpufleet.agent.probe import CRITICAL_XIDS, GpuProbe, GpuSample, NodeInventory, ProbeError

__all__ = ["Finding", "PreflightLimits", "check_gpu", "check_node", "preflight", "report", "run"]

log = logging.getLogger("gpufleet.agent")

Severity = Literal["fatal", "warning"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    check: str
    severity: Severity
    reason: str
    gpu: int | None = None

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"


@dataclass(frozen=True, slots=True, kw_only=True)
class PreflightLimits:
    max_temp_c: float = 85.0
    """The server's ``--gpu-temp-limit`` default."""
    require_ecc: bool = True
    expect_driver: str | None = None
    """After an upgrade: the driver version the node must now report (None: any)."""


def preflight(probe: GpuProbe, limits: PreflightLimits = PreflightLimits()) -> list[Finding]:
    """Run every check on ``probe``'s node now."""
    try:
        inv = probe.inventory()
        samples = probe.sample()
    except ProbeError as exc:
        return [Finding(check="nvml", severity="fatal", reason=f"cannot read the GPUs: {exc}"[:256])]
    out = check_node(inv, limits)
    for s in samples:
        out.extend(check_gpu(s, limits))
    return out


def check_node(inv: NodeInventory, limits: PreflightLimits) -> list[Finding]:
    """The node's software: its driver (and CUDA) as reported."""
    out: list[Finding] = []
    if limits.expect_driver is not None and inv.driver_version != limits.expect_driver:
        out.append(
            Finding(
                check="driver",
                severity="fatal",
                reason=f"driver {inv.driver_version or 'unknown'}, expected {limits.expect_driver}"[:256],
            )
        )
    elif inv.gpus and (not inv.driver_version or not inv.cuda_version):
        known = (("driver", inv.driver_version), ("CUDA", inv.cuda_version))
        missing = " and ".join(w for w, v in known if not v)
        out.append(Finding(check="driver", severity="warning", reason=f"no {missing} version reported"))
    return out


def check_gpu(s: GpuSample, limits: PreflightLimits) -> list[Finding]:
    """One GPU's sample: what keeps it from taking work."""
    i = s.index

    def fatal(check: str, reason: str) -> Finding:
        return Finding(check=check, severity="fatal", reason=f"GPU {i}: {reason}"[:256], gpu=i)

    if s.lost:
        return [fatal("gpu_lost", "fell off the bus")]
    out: list[Finding] = []
    if s.temperature_c is not None and s.temperature_c >= limits.max_temp_c:
        out.append(fatal("temperature", f"{s.temperature_c:.0f} C, limit {limits.max_temp_c:.0f} C"))
    if s.ecc_dbe:
        out.append(fatal("ecc_dbe", f"{s.ecc_dbe} volatile double-bit ECC error(s)"))
    bad = sorted({x for x in s.xid_events if x in CRITICAL_XIDS})
    if bad:
        out.append(fatal("xid", "XID " + ",".join(map(str, bad))))
    if limits.require_ecc and (why := gpuchecks.ecc_off(s.ecc_enabled)):
        out.append(fatal("ecc_mode", why))
    if why := gpuchecks.ecc_pending(s.ecc_enabled, s.ecc_pending):
        out.append(Finding(check="ecc_pending", severity="warning", reason=f"GPU {i}: {why}", gpu=i))
    busy = gpuchecks.is_busy(s.utilization_pct, s.throttle_reasons)
    pcie = gpuchecks.pcie_downtrained(
        gen=s.pcie_gen, max_gen=s.pcie_max_gen, width=s.pcie_width, max_width=s.pcie_max_width, busy=busy
    )
    if pcie:
        out.append(fatal("pcie", pcie))
    if why := gpuchecks.nvlink_down(s.nvlink_down):
        out.append(fatal("nvlink", why))
    return out


def run(
    probe: GpuProbe, node: str, at: float, limits: PreflightLimits = PreflightLimits()
) -> tuple[list[Finding], dict[str, Any] | None]:
    """``preflight``, logged, and what the next sync carries of it (None when every check
    passed: nothing to say, and an older server refuses the key)."""
    found = preflight(probe, limits)
    for f in found:
        log.warning("node %s: preflight %s: %s", node, f.severity, f.reason)
    return found, report(found, at) if found else None


def report(findings: list[Finding], at: float) -> dict[str, Any]:
    """The findings as ``api.nodes.Preflight`` takes them (a sync's ``preflight``)."""
    return {
        "at": at,
        "findings": [
            {"check": f.check, "severity": f.severity, "gpu": f.gpu, "reason": f.reason[:256]}
            for f in findings[:1024]
        ],
    }
