"""The health rules on what the reports name (issue 34), as tables: a downtrained PCIe
link (width in every report, generation only under load, several reports in a row),
NVLink links down, ECC off, and the shared pure checks (``gpufleet.gpuchecks``)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet import gpuchecks
from gpufleet.api.nodes import GpuTelemetry
from gpufleet.server.decide.health import HealthMonitor, HealthRules, assess, pcie_tally

RULES = HealthRules(temp_for_s=30, pcie_reports=3)
FULL = {"pcie_gen": 5, "pcie_width": 16, "pcie_max_gen": 5, "pcie_max_width": 16}
BUSY = {"utilization_pct": 90.0}
IDLE = {"utilization_pct": 0.0, "throttle_reasons": ["gpu_idle"]}


def tel(**kw: Any) -> GpuTelemetry:
    return GpuTelemetry(index=0, **kw)


TALLY = [
    ("full_link", (0, 0), tel(**FULL, **BUSY), (0, 0)),
    ("narrow_counts", (1, 0), tel(**{**FULL, "pcie_width": 8}, **IDLE), (2, 0)),
    ("narrow_cleared", (2, 0), tel(**FULL, **IDLE), (0, 0)),
    ("slow_busy_counts", (0, 2), tel(**{**FULL, "pcie_gen": 3}, **BUSY), (0, 3)),
    ("slow_idle_is_power_saving", (0, 2), tel(**{**FULL, "pcie_gen": 1}, **IDLE), (0, 2)),
    ("fast_busy_clears_gen", (0, 2), tel(**FULL, **BUSY), (0, 0)),
    ("busy_but_idle_throttled", (0, 1), tel(**{**FULL, "pcie_gen": 1}, utilization_pct=50.0,
                                            throttle_reasons=["gpu_idle"]), (0, 1)),
    ("no_max_reported", (2, 2), tel(pcie_gen=1, pcie_width=4, **BUSY), (2, 2)),
    ("gen3_slot_is_not_downtrained", (0, 0), tel(pcie_gen=3, pcie_width=16, pcie_max_gen=3,
                                                 pcie_max_width=16, **BUSY), (0, 0)),
]  # fmt: skip


@pytest.mark.parametrize(("prev", "reading", "want"), [c[1:] for c in TALLY], ids=[c[0] for c in TALLY])
def test_pcie_tally(prev: tuple[int, int], reading: GpuTelemetry, want: tuple[int, int]) -> None:
    assert pcie_tally(prev, reading) == want


ASSESS = [
    ("healthy", tel(**FULL, **BUSY, ecc_enabled=True, nvlink_down=[]), (0, 0), []),
    ("narrow_2_reports", tel(**{**FULL, "pcie_width": 8}), (2, 0), []),
    ("narrow_3_reports", tel(**{**FULL, "pcie_width": 8}), (3, 0), ["pcie"]),
    ("slow_gen_3_busy_reports", tel(**{**FULL, "pcie_gen": 4}, **BUSY), (0, 3), ["pcie"]),
    ("links_down", tel(nvlink_down=[2, 5]), (0, 0), ["nvlink"]),
    ("ecc_off", tel(ecc_enabled=False, ecc_pending=False), (0, 0), ["ecc_mode"]),
    ("ecc_unsupported", tel(ecc_enabled=None), (0, 0), []),
    ("volatile_dbe", tel(ecc_dbe=2, ecc_enabled=True), (0, 0), ["ecc"]),
    ("everything", tel(**{**FULL, "pcie_width": 4}, nvlink_down=[0], ecc_enabled=False, temperature_c=90),
     (3, 0), ["temperature", "pcie", "nvlink", "ecc_mode"]),
]  # fmt: skip


@pytest.mark.parametrize(("reading", "tally", "want"), [c[1:] for c in ASSESS], ids=[c[0] for c in ASSESS])
def test_assess_links(reading: GpuTelemetry, tally: tuple[int, int], want: list[str]) -> None:
    assert [f.rule for f in assess(RULES, reading, hot_for_s=60, pcie_low=tally)] == want


def test_rules_switched_off() -> None:
    off = HealthRules(pcie_reports=0, nvlink=False, require_ecc=False)
    reading = tel(**{**FULL, "pcie_width": 8}, nvlink_down=[1], ecc_enabled=False)
    assert assess(off, reading, hot_for_s=0, pcie_low=(99, 99)) == []


def test_reasons_say_what_is_wrong() -> None:
    found = assess(RULES, tel(**{**FULL, "pcie_width": 8}, nvlink_down=[3]), hot_for_s=0, pcie_low=(3, 0))
    reasons = {f.rule: f.reason for f in found}
    assert reasons["pcie"] == "PCIe link downtrained: x8 of x16 (3 reports in a row)"
    assert reasons["nvlink"] == "NVLink link 3 down"


def test_monitor_needs_reports_in_a_row() -> None:
    """Two narrow readings, a full one, then three narrow: the rule fires on the last."""
    m = HealthMonitor(RULES)
    narrow, full = tel(**{**FULL, "pcie_width": 8}), tel(**FULL)
    for t, reading in enumerate([narrow, narrow, full, narrow, narrow]):
        assert not m.observe("n", [reading], now=float(t))
    assert m.observe("n", [narrow], now=5.0)
    assert [f.rule for f in m.take()[("n", 0)]] == ["pcie"]


def test_monitor_idle_gen_never_fires() -> None:
    """A GPU idling at Gen1 (power saving) for ever is not downtrained."""
    m = HealthMonitor(RULES)
    for t in range(10):
        assert not m.observe("n", [tel(**{**FULL, "pcie_gen": 1}, **IDLE)], now=float(t))
    assert m.take() == {}


CHECKS = [
    ("width", dict(gen=5, max_gen=5, width=8, max_width=16, busy=False), "PCIe link downtrained: x8 of x16"),
    ("gen_idle", dict(gen=1, max_gen=5, width=16, max_width=16, busy=False), None),
    ("gen_busy", dict(gen=3, max_gen=4, width=16, max_width=16, busy=True),
     "PCIe link downtrained: Gen3 of Gen4 under load"),
    ("both", dict(gen=3, max_gen=4, width=8, max_width=16, busy=True),
     "PCIe link downtrained: x8 of x16, Gen3 of Gen4 under load"),
    ("unknown", dict(gen=None, max_gen=None, width=None, max_width=16, busy=True), None),
    ("zero_is_not_a_reading", dict(gen=0, max_gen=4, width=0, max_width=16, busy=True), None),
]  # fmt: skip


@pytest.mark.parametrize(("kw", "want"), [c[1:] for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_pcie_downtrained(kw: dict[str, Any], want: str | None) -> None:
    assert gpuchecks.pcie_downtrained(**kw) == want


def test_ecc_pending_and_links() -> None:
    assert gpuchecks.ecc_pending(True, False) == "ECC mode change pending a reboot (on -> off)"
    assert gpuchecks.ecc_pending(True, True) is None and gpuchecks.ecc_pending(None, True) is None
    assert gpuchecks.nvlink_down([]) is None
    assert gpuchecks.nvlink_down([4, 1]) == "NVLink links 1,4 down"
