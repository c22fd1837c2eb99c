"""The health rules and the requeue backoff as pure functions (tables)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.server.decide.health import HealthMonitor, HealthRules, assess
from gpufleet.server.jobstate.requeue import backoff_s

RULES = HealthRules(temp_for_s=30, recover_after_s=600)


def tel(**kw: Any) -> GpuTelemetry:
    return GpuTelemetry(index=0, **kw)


@pytest.mark.parametrize(
    ("reading", "hot_for", "want"),
    [
        (tel(temperature_c=70), 0, []),
        (tel(temperature_c=90), 10, []),
        (tel(temperature_c=90), 30, ["temperature"]),
        (tel(temperature_c=84.9), 999, []),
        (tel(temperature_c=85), 30, ["temperature"]),
        (tel(xid_events=[79]), 0, ["xid"]),
        (tel(xid_events=[48, 13]), 0, ["xid"]),
        (tel(xid_events=[13, 31]), 0, []),
        (tel(ecc_dbe=1), 0, ["ecc"]),
        (tel(ecc_dbe=0, ecc_sbe=500), 0, []),
        (tel(lost=True, xid_events=[79]), 0, ["lost", "xid"]),
        (tel(retired_pages=59), 0, []),
        (tel(retired_pages=60), 0, ["retired_pages"]),
    ],
    ids=[
        "normal", "hot-not-long-enough", "hot-sustained", "below-limit", "at-limit-counts", "xid-79",
        "xid-48-among-others",
        "harmless-xids", "ecc-dbe", "sbe-only", "lost", "retired-below", "retired-limit",
    ],
)  # fmt: skip
def test_assess(reading: GpuTelemetry, hot_for: float, want: list[str]) -> None:
    assert [f.rule for f in assess(RULES, reading, hot_for_s=hot_for)] == want


def test_monitor_sustain_latch_and_recover() -> None:
    m = HealthMonitor(RULES)
    assert not m.observe("n", [tel(temperature_c=95)], now=0)
    assert not m.observe("n", [tel(temperature_c=95)], now=20)
    assert m.observe("n", [tel(temperature_c=95)], now=31)
    assert [f.rule for f in m.take()[("n", 0)]] == ["temperature"]
    assert m.take() == {}
    m.observe("n", [tel(temperature_c=60)], now=40)
    assert m.cool_for("n", 0, now=640) == 600
    m.observe("n", [tel(temperature_c=95)], now=641)
    assert m.cool_for("n", 0, now=700) == 0


@pytest.mark.parametrize(
    ("requeues", "base", "want"),
    [(1, 10, 0), (2, 10, 10), (3, 10, 20), (5, 10, 80), (20, 10, 600), (2, 0, 0)],
    ids=["first-immediate", "second-base", "doubles", "doubles-again", "capped", "no-backoff"],
)
def test_backoff(requeues: int, base: float, want: float) -> None:
    assert backoff_s(SimpleNamespace(requeue_backoff_s=base), requeues) == want  # type: ignore[arg-type]
