"""A real Prometheus (Debian's ``prometheus``) scrapes a running demo fleet every second;
a PromQL query through its HTTP API returns the 400 GPUs' DCGM temperature series and
the rules file loads."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.conftest import free_port
from web.conftest import DemoFleet

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RULES = Path(__file__).resolve().parents[2] / "prometheus" / "gpufleet-rules.yml"

pytestmark = pytest.mark.skipif(
    not Path(PROMETHEUS).exists(),
    reason="prometheus binary not installed (Debian: apt-get install prometheus); integration test skipped",
)


def _query(url: str, q: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/query", params={"query": q}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_scrapes_the_demo_fleet(demo_fleet: DemoFleet, tmp_path: Path) -> None:
    target = demo_fleet.url.removeprefix("http://")
    token = tmp_path / "scrape-token"  # /metrics takes an operator's or admin's token
    token.write_text(demo_fleet.token + "\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: gpufleet\n    static_configs: [{{targets: ['{target}']}}]\n"
        f"    authorization: {{credentials_file: '{token}'}}\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 45
        series: list[dict[str, Any]] = []
        while len(series) != 400:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, f"{len(series)} DCGM_FI_DEV_GPU_TEMP series after 45 s"
            time.sleep(0.5)
            try:
                series = _query(url, "DCGM_FI_DEV_GPU_TEMP")
            except httpx.HTTPError:
                series = []
        assert len({s["metric"]["UUID"] for s in series}) == 400
        assert {s["metric"]["Hostname"] for s in series} == {f"node-{i:03d}" for i in range(50)}
        assert {s["metric"]["job"] for s in series} == {"gpufleet"}
        assert _query(url, "sum(gpufleet_gpus)")[0]["value"][1] == "400"
        assert _query(url, "count(gpufleet_node_ready == 1)")[0]["value"][1] == "50"
        groups = httpx.get(url + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {"gpufleet-gpus", "gpufleet-nodes", "gpufleet-queue"} <= {g["name"] for g in groups}
        assert all(r["health"] != "err" for g in groups for r in g["rules"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
