"""``prometheus/gpufleet-rules.yml`` is valid for ``promtool``, passes its unit tests
(``gpufleet-rules.test.yml``: the budget and service rules on synthetic series) and only
reads series gpufleet exports."""

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
RULE_TESTS = ROOT / "prometheus" / "gpufleet-rules.test.yml"
CONFIG = ROOT / "prometheus" / "prometheus.yml"
PROMETHEUS_OWN = {"up"}

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian: apt-get install prometheus); rules not validated",
)


@needs_promtool
@pytest.mark.parametrize(
    ("args", "path"),
    [(["check", "rules"], RULES), (["check", "config"], CONFIG), (["test", "rules"], RULE_TESTS)],
    ids=["rules", "config", "rule-unit-tests"],
)
def test_promtool_accepts(args: list[str], path: Path, tmp_path: Path) -> None:
    if path == CONFIG:  # beside a copy: the scrape token file it names (promtool checks it exists)
        for f in (CONFIG, RULES):
            shutil.copy(f, tmp_path / f.name)
        (tmp_path / "gpufleet-token").write_text("gf_example\n")
        path = tmp_path / CONFIG.name
    out = subprocess.run(["promtool", *args, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_rule_unit_tests_cover_the_budget_and_service_rules() -> None:
    text = RULE_TESTS.read_text()
    want = {
        "BudgetNearLimit",
        "BudgetExhausted",
        "ServiceP99AboveSLO",
        "ServiceErrorRateHigh",
        "ServiceAtMaxReplicas",
    }
    assert want <= set(re.findall(r"alertname: (\w+)", text))
    for name in want - {"BudgetExhausted"}:  # each both quiet and firing
        cases = re.findall(rf"alertname: {name}\n\s+exp_alerts:( \[\])?", text)
        assert "" in cases and " []" in cases, name


def test_rules_read_exported_series(tmp_path: Path) -> None:
    text = RULES.read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    want = {
        "GpuHot", "GpuFatalXid", "NodeNotReady", "QueueWaitHigh", "BudgetNearLimit", "BudgetExhausted",
        "ServiceP99AboveSLO", "ServiceErrorRateHigh", "ServiceAtMaxReplicas",
    }  # fmt: skip
    assert want <= set(alerts)
    exprs = re.findall(r"expr: >-\n((?:\s{10}.*\n)+)|expr: (.+)", text)
    names = {n for block, line in exprs for n in metric_names(block or line)}
    with fleet(tmp_path, service=True) as f:
        exposed = set(Fleet.scrape(f))
    assert names - exposed - PROMETHEUS_OWN == set()
