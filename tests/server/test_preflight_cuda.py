"""Issue 34 on a running server: CUDA at placement (a job that needs a newer CUDA than
any driver of its pool waits with the reason; one the drivers support runs there; bad
versions are a 422 problem+json that changes nothing; ``gpufleet submit --cuda``), and
the health rules on what the reports name (a GPU whose PCIe link trains narrow for three
reports, or at the temperature limit, is cordoned with the reason)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from server.conftest import (
    Server,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    ok,
    start_server,
    stop_server,
    wait_for,
)


def _until(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _sync(srv: Server, node: str, **body: Any) -> None:
    with srv.client() as c:
        ok(c.post(f"/nodes/{node}/sync", json={"jobs": [], **body}))


def _pool_with_driver(srv: Server, cuda: str) -> tuple[str, str]:
    pool = make_pool(srv)
    node = make_node(srv, pool=pool, gpus=2)
    _sync(srv, node, cuda_version=cuda, driver_version="550.54.15")  # live, with its driver
    return pool, node


def test_a_job_needing_newer_cuda_waits_with_the_reason(server: Server) -> None:
    pool, node = _pool_with_driver(server, "12.4")
    team = make_team(server)
    with server.client() as c:
        base = {"command": ["true"], "gpus": 1, "pool": pool, "team": team}
        waits = ok(c.post("/jobs", json={**base, "cuda": "99.0"}), 201)
        runs = ok(c.post("/jobs", json={**base, "cuda": "12.4.1"}), 201)
    assert runs["cuda"] == "12.4" and waits["cuda"] == "99.0"  # canonical
    placed = wait_for(server, runs["id"], "SCHEDULED")
    assert [a["node"] for a in placed["allocation"]] == [node]
    want = f"BadConstraints: needs CUDA 99.0; the newest driver in pool {pool} supports 12.4"

    def reason() -> str | None:
        with server.client() as c:
            job = ok(c.get(f"/jobs/{waits['id']}"))
        assert job["state"] == "PENDING"
        return job["wait_reason"] if job["wait_reason"] == want else None

    assert _until(reason) == want
    # the pool's driver is upgraded (its agent reports CUDA 99.1): the job runs there
    _sync(server, node, cuda_version="99.1")
    wait_for(server, waits["id"], "SCHEDULED")


@pytest.mark.parametrize("bad", ["abc", "1e9", "12.x", "0.1", "100", "", 12.4])
def test_bad_cuda_is_a_problem_and_changes_nothing(server: Server, bad: object) -> None:
    pool = make_pool(server)
    before = server.counts()["jobs"]
    with server.client() as c:
        resp = c.post("/jobs", json={"command": ["true"], "gpus": 1, "pool": pool, "cuda": bad})
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert "cuda" in resp.text
    assert server.counts()["jobs"] == before


def test_submit_cuda_on_the_command_line(server: Server) -> None:
    pool, _ = _pool_with_driver(server, "12.2")
    team = make_team(server)
    out = gpufleet(
        "submit", "--pool", pool, "--team", team, "--gpus", "1", "--cuda", "12.4", "--json", "--", "true",
        env=server.env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert '"cuda": "12.4"' in out.stdout or '"cuda":"12.4"' in out.stdout
    bad = gpufleet("submit", "--pool", pool, "--gpus", "1", "--cuda", "abc", "--", "true", env=server.env())
    assert bad.returncode != 0 and "CUDA version 'abc'" in bad.stderr + bad.stdout


# -- health rules on a server of their own (no wait for a hot GPU) -----------------------------


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("rules") / "rules.db"
    srv = start_server(f"sqlite:///{db}", extra=("--gpu-hot-for", "0s", "--gpu-temp-limit", "83"))
    yield srv
    stop_server(srv)


FULL = {"pcie_gen": 5, "pcie_width": 16, "pcie_max_gen": 5, "pcie_max_width": 16}


def _gpu(srv: Server, node: str, index: int) -> dict[str, Any]:
    with srv.client() as c:
        return dict(ok(c.get(f"/nodes/{node}"))["gpus"][index])


def test_downtrained_link_cordons_the_gpu_after_three_reports(quick: Server) -> None:
    node = make_node(quick, pool=make_pool(quick), gpus=2)
    narrow = {"index": 1, "temperature_c": 40.0, **FULL, "pcie_width": 8}
    fine = {"index": 0, "temperature_c": 40.0, **FULL}
    for _ in range(2):
        _sync(quick, node, telemetry=[fine, narrow])
    time.sleep(1.0)
    assert not _gpu(quick, node, 1)["cordoned"]  # two reports: not yet
    _sync(quick, node, telemetry=[fine, narrow])
    gpu1 = _until(lambda: (g := _gpu(quick, node, 1))["cordoned"] and g)
    assert gpu1, _gpu(quick, node, 1)
    assert gpu1["cordon_reason"] == "PCIe link downtrained: x8 of x16 (3 reports in a row)"
    assert not _gpu(quick, node, 0)["cordoned"]
    with quick.client() as c:
        events = ok(c.get("/fleet/events", params={"node": node}))
    assert any(e["kind"] == "gpu_cordoned" and e["gpu_index"] == 1 for e in events)


def test_idle_gen1_is_not_downtrained(quick: Server) -> None:
    node = make_node(quick, pool=make_pool(quick), gpus=1)
    idle = {"index": 0, **FULL, "pcie_gen": 1, "utilization_pct": 0.0, "throttle_reasons": ["gpu_idle"]}
    for _ in range(5):
        _sync(quick, node, telemetry=[idle])
    time.sleep(1.5)
    assert not _gpu(quick, node, 0)["cordoned"]


def test_gpu_at_the_temperature_limit_is_cordoned(quick: Server) -> None:
    node = make_node(quick, pool=make_pool(quick), gpus=1)
    _sync(quick, node, telemetry=[{"index": 0, "temperature_c": 82.9}])
    _sync(quick, node, telemetry=[{"index": 0, "temperature_c": 83.0}])
    gpu = _until(lambda: (g := _gpu(quick, node, 0))["cordoned"] and g)
    assert gpu and gpu["cordon_reason"].startswith("83 C, at or above 83 C"), _gpu(quick, node, 0)


def test_links_down_and_ecc_off_cordon(quick: Server) -> None:
    node = make_node(quick, pool=make_pool(quick), gpus=2)
    _sync(
        quick,
        node,
        telemetry=[
            {"index": 0, "nvlink_down": [3]},
            {"index": 1, "ecc_enabled": False, "ecc_pending": False},
        ],
    )
    assert _until(lambda: _gpu(quick, node, 0)["cordoned"] and _gpu(quick, node, 1)["cordoned"])
    assert _gpu(quick, node, 0)["cordon_reason"] == "NVLink link 3 down"
    assert _gpu(quick, node, 1)["cordon_reason"] == "ECC disabled (supported by this GPU)"


def test_bad_telemetry_fields_are_refused(quick: Server, tmp_path: Path) -> None:
    node = make_node(quick, pool=make_pool(quick), gpus=1)
    with quick.client() as c:
        resp = c.post(
            f"/nodes/{node}/sync", json={"jobs": [], "telemetry": [{"index": 0, "pcie_max_width": 10**9}]}
        )
        assert resp.status_code == 422 and resp.headers["content-type"] == "application/problem+json"
        resp = c.post(
            f"/nodes/{node}/sync",
            json={"jobs": [], "preflight": {"at": 1.0, "findings": [{"check": "x; rm", "severity": "fatal",
                                                                    "reason": "r"}]}},
        )  # fmt: skip
        assert resp.status_code == 422
        assert not ok(c.get(f"/nodes/{node}"))["cordoned"]
