"""``gpufleet loadgen`` and its engine against a tiny aiohttp server on loopback (in a
thread of its own): the rate it offers and achieves, shapes, errors by code, and the
``--json-out`` document. Schedules are checked without a server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.loadgen import LoadShape, Report, Target, run_load, schedule


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _target_app() -> web.Application:
    count = {"flaky": 0}

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def flaky(request: web.Request) -> web.Response:
        count["flaky"] += 1
        n = count["flaky"]
        return web.Response(status=503 if n % 4 == 0 else 404 if n % 5 == 0 else 200)

    async def infer(request: web.Request) -> web.Response:
        doc = await request.json()
        shape = doc["inputs"][0]["shape"]
        auth = request.headers.get("Authorization")
        good = shape == [1, 16] and len(doc["inputs"][0]["data"]) == 16 and auth == "Bearer t0k"
        return web.json_response({"outputs": []}, status=200 if good else 400)

    application = web.Application()
    application.router.add_get("/ok", ok)
    application.router.add_get("/flaky", flaky)
    application.router.add_post("/v2/models/mlp/infer", infer)
    return application


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    port = _free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_target_app(), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def _run(url: str, shape: LoadShape, *, arrivals: str = "uniform", every_s: float = 0.5) -> Report:
    return asyncio.run(run_load(Target(url=url), shape, arrivals=arrivals, report_every_s=every_s))


# --- schedules, no server -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "windows"),
    [
        (LoadShape(qps=100, duration_s=10), [(0, 10, 100)]),
        (
            LoadShape(kind="step", qps=50, peak_qps=200, step_at_s=4, duration_s=10),
            [(0, 4, 50), (4, 10, 200)],
        ),
        (LoadShape(kind="ramp", qps=50, peak_qps=250, duration_s=10), [(0, 1, 60), (9, 10, 240)]),
        (
            LoadShape(kind="sine", qps=50, peak_qps=250, period_s=10, duration_s=10),
            [(0, 1, 55), (4.5, 5.5, 248), (9, 10, 55)],
        ),
    ],
    ids=["constant", "step", "ramp", "sine"],
)
@pytest.mark.parametrize("arrivals", ["uniform", "poisson"])
def test_schedule_follows_the_shape(
    shape: LoadShape, windows: list[tuple[float, float, float]], arrivals: str
) -> None:
    times = list(schedule(shape, arrivals=arrivals, seed=1))
    assert times == sorted(times) and times[0] >= 0 and times[-1] < shape.duration_s
    tolerance = 0.04 if arrivals == "uniform" else 0.35  # Poisson: a few dozen arrivals a window
    for start, end, rate in windows:
        got = sum(start <= t < end for t in times) / (end - start)
        assert got == pytest.approx(rate, rel=tolerance), (start, end)


# --- against the server ---------------------------------------------------------------------


@pytest.mark.parametrize("arrivals", ["uniform", "poisson"])
def test_constant_rate_is_achieved(base: str, arrivals: str) -> None:
    report = _run(f"{base}/ok", LoadShape(qps=200, duration_s=2), arrivals=arrivals)
    s = report.summary
    assert s.errors == {} and s.ok == s.sent
    assert s.achieved_qps == pytest.approx(200, rel=0.1)
    assert s.p50_ms is not None and s.p99_ms is not None and 0 < s.p50_ms <= s.p99_ms < 1000
    assert [i.start_s for i in report.intervals] == [0, 0.5, 1, 1.5]
    assert sum(i.ok for i in report.intervals) == s.ok


def test_step_changes_the_rate(base: str) -> None:
    shape = LoadShape(kind="step", qps=40, peak_qps=240, step_at_s=1, duration_s=2)
    report = _run(f"{base}/ok", shape)
    offered = [i.offered_qps for i in report.intervals]
    assert offered == pytest.approx([40, 40, 240, 240], rel=0.1)
    assert report.intervals[1].achieved_qps < 60 < 200 < report.intervals[2].achieved_qps


def test_errors_are_counted_by_code(base: str) -> None:
    report = _run(f"{base}/flaky", LoadShape(qps=100, duration_s=1))
    s = report.summary
    assert s.sent == 100 and set(s.errors) == {"404", "503"}
    assert s.errors["503"] == 25 and s.errors["404"] == 15 and s.ok == 60
    per_interval: dict[str, int] = {}
    for i in report.intervals:
        for code, n in i.errors.items():
            per_interval[code] = per_interval.get(code, 0) + n
    assert per_interval == s.errors


def test_a_closed_port_is_a_connection_error() -> None:
    report = _run(f"http://127.0.0.1:{_free_port()}/", LoadShape(qps=20, duration_s=0.5))
    assert report.summary.errors == {"conn": report.summary.sent} and report.summary.ok == 0


def test_cli_sends_a_kserve_body_and_writes_json(base: str, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["loadgen", f"{base}/v2/models/mlp/infer", "--qps", "50", "--duration", "1s"]
    argv += ["--report-every", "0.5s", "--token", "t0k", "--arrivals", "uniform", "--json-out", str(out)]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 0, done.output
    assert "offered" in done.output and "p99" in done.output
    doc = json.loads(out.read_text())
    assert set(doc) == {"intervals", "summary"} and len(doc["intervals"]) == 2
    assert set(doc["intervals"][0]) == {
        "start_s", "end_s", "offered_qps", "achieved_qps", "ok", "p50_ms", "p99_ms", "errors",
    }  # fmt: skip
    summary = doc["summary"]
    assert summary["errors"] == {} and summary["ok"] == summary["sent"] == 50
    assert {"p50_ms", "p99_ms", "p999_ms", "achieved_qps", "offered_qps"} <= set(summary)


def test_cli_exits_1_when_nothing_succeeds(base: str) -> None:
    argv = ["loadgen", f"{base}/v2/models/mlp/infer", "--qps", "20", "--duration", "0.5s"]
    argv += ["--arrivals", "uniform", "--json"]
    done = CliRunner().invoke(app, argv)  # no token: the server answers 400
    assert done.exit_code == 1
    assert json.loads(done.output)["summary"]["errors"] == {"400": 10}
