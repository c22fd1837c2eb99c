"""The Grafana dashboard queries only series gpufleet exports: every panel's PromQL is
parsed for metric names, each checked against what ``/metrics`` of a running server
(in-process, with telemetry, a placed and a waiting job, and an inference service with
gateway traffic) actually exposes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from web.fleetapp import Fleet, fleet

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "grafana").glob("*.json"))

_FUNCS_AND_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (inside ``{}`` or a ``by (...)`` list), durations or Grafana variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\{?\w+\}?", "1", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end() :].lstrip()
        if after.startswith("(") or word.lower() in _FUNCS_AND_WORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # 1e3, 5m
        names.add(word)
    return names


def exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield p["title"], t["expr"]
            yield from walk(p.get("panels", []))

    yield from walk(dashboard["panels"])
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        text = q.get("query") if isinstance(q, dict) else None
        if var.get("type") == "query" and text:
            inner = re.match(r"label_values\((\w+)", text)
            yield f"variable {var['name']}", inner.group(1) if inner else text


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("sum(gpufleet_gpus)", {"gpufleet_gpus"}),
        ('DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node"} > 0', {"DCGM_FI_DEV_GPU_UTIL"}),
        (
            "histogram_quantile(0.99, sum by (le, route) (rate(x_bucket[5m])))",
            {"x_bucket"},
        ),
        ("a / (b + c) * $__range_s / 3600", {"a", "b", "c"}),
        ("avg_over_time(m[$__range]) or vector(0)", {"m"}),
    ],
    ids=["plain", "matcher", "histogram", "arith", "vars"],
)
def test_metric_names_parser(expr: str, want: set[str]) -> None:
    assert metric_names(expr) == want


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    with fleet(tmp_path_factory.mktemp("grafana"), service=True) as f:
        f.client.get("/v1/fleet/summary")
        return set(Fleet.scrape(f))


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_every_panel_queries_exported_series(path: Path, exposed: set[str]) -> None:
    dash = json.loads(path.read_text())
    found = list(exprs(dash))
    assert len(found) >= 20, "a fleet, per-node, queue and cost dashboard"
    missing = {(title, n) for title, e in found for n in metric_names(e) if n not in exposed}
    assert not missing, f"panels query series /metrics does not expose: {sorted(missing)}"
    titles = {p["title"] for p in dash["panels"] if p["type"] == "row"}
    assert titles == {"Fleet overview", "Per-node GPUs", "Queue and scheduler", "Usage and cost", "Services"}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_the_services_row_has_its_panels() -> None:
    dash = json.loads((ROOT / "grafana" / "gpufleet-fleet.json").read_text())
    row = next(p for p in dash["panels"] if p["type"] == "row" and p["title"] == "Services")
    below = [p for p in dash["panels"] if p["gridPos"]["y"] > row["gridPos"]["y"]]
    names = {n for p in below for t in p["targets"] for n in metric_names(t["expr"])}
    assert names == {
        "gpufleet_service_requests_total",
        "gpufleet_service_request_seconds_bucket",
        "gpufleet_service_slo_p99_seconds",
        "gpufleet_service_inflight",
        "gpufleet_service_replicas",
        "gpufleet_service_replicas_max",
        "gpufleet_service_gpu_utilization",
        "gpufleet_service_energy_wh_per_1k",
        "gpufleet_service_cost_per_1k",
    }
    states = {s for p in below for t in p["targets"] for s in re.findall(r'state="(\w+)"', t["expr"])}
    assert states == {"desired", "ready", "warm"}
