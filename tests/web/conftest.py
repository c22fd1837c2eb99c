"""One ``gpufleet demo`` fleet (50 agents x 8 simulated H100s, trace workload) shared by
the browser and Prometheus tests of this directory, and the browser: a headless Chromium
(Debian's /usr/bin/chromium, driven by Playwright; no browser is downloaded) per module,
a page per test that fails the test on any script error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.conftest import free_port

TOKEN = "gf_web_test_admin"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")


@dataclass(frozen=True)
class DemoFleet:
    url: str
    token: str

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url + "/v1", headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )


@pytest.fixture(scope="module")
def demo_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoFleet]:
    """A 50-node demo for one module's tests. Module scope, not session: the demo costs
    about half a core while it runs, and a session fixture would keep it running beside
    every later test of its worker (under ``pytest -n 2`` that is most of the suite)."""
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium not installed (Debian: apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")  # a refused token: 401
            else None
        ),
    )
    yield pg
    ctx.close()
    assert not errors, errors


def sign_in(page: Any, url: str, token: str) -> None:
    page.goto(url + "/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#heatmap .tile")
