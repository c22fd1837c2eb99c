"""Pure checks of what a GPU reports about its links and memory: shared by the server's
health rules (``server/decide/health.py``) and the agent's preflight
(``agent/preflight.py``), which import nothing of each other.

Each returns the reason for people, or None when the reading is fine or not reported
(a field NVML does not give on that GPU is None: never a finding).

- **PCIe**: NVML's ``nvmlDeviceGetMaxPcieLinkGeneration``/``Width`` is the most the GPU
  *and its slot* can do (a Gen4 GPU in a Gen3 slot has max 3: a topology fact, not a
  fault). A GPU lowers its link *generation* when idle, to save power (nvidia-smi: the
  current link "may be reduced when the GPU is not in use"); DCGM's PCIe plugin checks
  the link while it drives traffic over it. So the generation counts only while the
  GPU is busy (``busy``); the *width* (lanes) counts always: a x16 GPU training at x8 is
  a seating, riser or cable fault. The server's rule asks for the shortfall in several
  reports in a row (``HealthRules.pcie_reports``), so one reading taken as the load
  changes does not cordon.
- **NVLink**: links NVML reports inactive among those it supports (DCGM's "Down", as
  against "Disabled": not supported, not counted).
- **ECC**: the mode off where the GPU supports it (a data-centre GPU runs with ECC on;
  off, a flipped bit is silent corruption); a mode change pending a reboot.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BUSY_UTIL_PCT", "ecc_off", "ecc_pending", "is_busy", "nvlink_down", "pcie_downtrained"]

BUSY_UTIL_PCT = 10.0
"""A GPU this busy (or more) keeps its PCIe link at full speed."""


def is_busy(utilization_pct: float | None, throttle_reasons: Sequence[str] = ()) -> bool:
    """The GPU is working (its link generation is meaningful): utilisation at or above
    ``BUSY_UTIL_PCT`` and not idle-throttled."""
    if utilization_pct is None or utilization_pct < BUSY_UTIL_PCT:
        return False
    return "gpu_idle" not in throttle_reasons


def pcie_downtrained(
    *, gen: int | None, max_gen: int | None, width: int | None, max_width: int | None, busy: bool
) -> str | None:
    """Why this link is below what the GPU and slot can do (None: it is not, or cannot
    be told)."""
    short: list[str] = []
    if width is not None and max_width is not None and 0 < width < max_width:
        short.append(f"x{width} of x{max_width}")
    if busy and gen is not None and max_gen is not None and 0 < gen < max_gen:
        short.append(f"Gen{gen} of Gen{max_gen} under load")
    return "PCIe link downtrained: " + ", ".join(short) if short else None


def nvlink_down(links: Sequence[int]) -> str | None:
    if not links:
        return None
    shown = ",".join(map(str, sorted(links)[:18]))
    return f"NVLink link{'s' if len(links) > 1 else ''} {shown} down"


def ecc_off(enabled: bool | None) -> str | None:
    return "ECC disabled (supported by this GPU)" if enabled is False else None


def ecc_pending(enabled: bool | None, pending: bool | None) -> str | None:
    if enabled is None or pending is None or enabled == pending:
        return None
    return f"ECC mode change pending a reboot ({'on' if enabled else 'off'} -> {'on' if pending else 'off'})"
