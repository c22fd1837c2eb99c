"""``prometheus/gpufleet-rules.yml`` is valid for ``promtool`` and, except the budget rule
that waits for pricing, only reads series gpufleet exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_grafana import metric_names
from web.fleetapp import Fleet, fleet

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "prometheus" / "gpufleet-rules.yml"
CONFIG = ROOT / "prometheus" / "prometheus.yml"
LATER = {"gpufleet_team_cost_accrued", "gpufleet_team_budget"}  # pricing: a later issue
PROMETHEUS_OWN = {"up"}

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian: apt-get install prometheus); rules not validated",
)


@needs_promtool
@pytest.mark.parametrize(("what", "path"), [("rules", RULES), ("config", CONFIG)], ids=["rules", "config"])
def test_promtool_accepts(what: str, path: Path) -> None:
    out = subprocess.run(["promtool", "check", what, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_read_exported_series(tmp_path: Path) -> None:
    text = RULES.read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    assert {"GpuHot", "GpuFatalXid", "NodeNotReady", "QueueWaitHigh", "BudgetNearLimit"} <= set(alerts)
    exprs = re.findall(r"expr: >-\n((?:\s{10}.*\n)+)|expr: (.+)", text)
    names = {n for block, line in exprs for n in metric_names(block or line)}
    with fleet(tmp_path) as f:
        exposed = set(Fleet.scrape(f))
    assert names - exposed - PROMETHEUS_OWN == LATER
