"""One ``gpufleet demo`` fleet (50 agents x 8 simulated H100s, trace workload) shared by
the browser and Prometheus tests of this directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from server.conftest import free_port

TOKEN = "gf_web_test_admin"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@dataclass(frozen=True)
class DemoFleet:
    url: str
    token: str

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url + "/v1", headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )


@pytest.fixture(scope="session")
def demo_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoFleet]:
    port = free_port()
    data = tmp_path_factory.mktemp("demo")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "demo", "--port", str(port), "--data-dir", str(data / "d")],
        env={**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fleet = DemoFleet(url=f"http://127.0.0.1:{port}", token=TOKEN)
    try:
        deadline = time.monotonic() + 60
        with fleet.client() as c:
            while True:
                assert proc.poll() is None, "gpufleet demo exited"
                assert time.monotonic() < deadline, "the demo fleet did not come up in 60 s"
                try:
                    s = c.get("/fleet/summary").json()
                    if s["nodes_ready"] == 50 and s["gpus"] == 400 and s["jobs"].get("RUNNING", 0) > 0:
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.5)
        yield fleet
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
