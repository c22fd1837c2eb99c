"""Did a node's driver upgrade work? A pure verdict on what its agent reported
(``api.upgrades.UpgradeReport``), as the NVIDIA GPU Operator's upgrade controller
validates a node before it uncordons it: the hook (if any) succeeded, the node reports
the expected driver, every GPU it has is reported healthy by NVML, and the smoke kernel
passed on each of them. The agent only reports facts; the server judges them here, so
an agent cannot talk its node back into service.

``failure`` returns None when the node passed, else the first reason, worded for
``upgrade status`` and the fleet event log.
"""

from __future__ import annotations

from gpufleet.api.upgrades import UpgradeReport


def failure(report: UpgradeReport, *, expect_driver: str, gpus: int) -> str | None:
    """Why the upgrade failed (None: it passed). ``gpus``: how many GPUs the server
    knows the node has (a verification that saw fewer failed: a GPU fell off the bus)."""
    if report.hook_error is not None:
        said = f"; output: {_tail(report.output)}" if report.output.strip() else ""
        return f"upgrade hook failed: {report.hook_error}{said}"
    if report.error is not None:
        return f"verification could not run: {report.error}"
    if report.driver_version != expect_driver:
        got = report.driver_version or "no driver"
        return f"driver {got} after the upgrade, expected {expect_driver}"
    seen = {g.index: g for g in report.gpus}
    if len(seen) < gpus:
        return f"{len(seen)} of {gpus} GPUs seen after the upgrade"
    for g in sorted(seen.values(), key=lambda g: g.index):
        if not g.healthy:
            return f"GPU {g.index} unhealthy after the upgrade{_detail(g.detail)}"
    for g in sorted(seen.values(), key=lambda g: g.index):
        if not g.smoke_ok:
            return f"GPU {g.index} failed the smoke check{_detail(g.detail)}"
    return None


def _detail(text: str) -> str:
    return f": {text}" if text else ""


def _tail(output: str, chars: int = 200) -> str:
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[-chars:]
