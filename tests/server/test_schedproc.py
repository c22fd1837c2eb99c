"""The scheduling loop in a child process (``server/loops/child.py``), against a real ``gpufleet
server``: a killed child is restarted and schedules again, its passes reach ``/metrics``,
and it never outlives the API process. Plus the report a pass sends over the pipe.

SQLite, a server of its own per test (they kill processes); the restart test also runs
on a scratch PostgreSQL database when GPUFLEET_TEST_DATABASE_URL is set."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpufleet.scheduler import Fleet, JobRequest, NodeGpus, Plan, Snapshot, Start
from gpufleet.server.loops.child import pass_report, summary
from server.conftest import (
    Server,
    make_node,
    make_pool,
    make_team,
    ok,
    scratch_postgres,
    start_server,
    stop_server,
    wait_for,
)


def eventually(what: Callable[[], Any], *, timeout: float = 15, step: float = 0.05) -> Any:
    """``what()`` once it is truthy; fails with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            assert got, f"not true after {timeout}s: {got!r}"
            return got
        time.sleep(step)


def scheduler_child(srv: Server) -> psutil.Process | None:
    """The server's scheduler process (``python -m gpufleet.server.loops.child``), if up."""
    try:
        kids = psutil.Process(srv.proc.pid).children()
    except psutil.NoSuchProcess:
        return None
    for kid in kids:
        try:
            if "gpufleet.server.loops.child" in kid.cmdline() and kid.status() != psutil.STATUS_ZOMBIE:
                return kid
        except psutil.NoSuchProcess:
            continue
    return None


def scheduling_passes(srv: Server) -> float:
    text = ok_text(srv, "/metrics")
    found = re.search(r"^gpufleet_scheduling_passes(?:_total)? ([0-9.e+]+)$", text, re.MULTILINE)
    assert found is not None, text[:2000]
    return float(found.group(1))


def ok_text(srv: Server, path: str) -> str:
    with srv.client() as c:
        resp = c.get(srv.url + path)
    assert resp.status_code == 200, resp.text
    return resp.text


def submit_and_schedule(srv: Server, *, pool: str, team: str) -> dict[str, Any]:
    with srv.client() as c:
        job = ok(c.post("/jobs", json={"command": ["true"], "gpus": 1, "pool": pool, "team": team}), 201)
    scheduled: dict[str, Any] = wait_for(srv, job["id"], "SCHEDULED", timeout=15)
    with srv.client() as c:
        ok(c.post(f"/jobs/{job['id']}/cancel"))  # frees the GPU for the next test step
    return scheduled


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(f"sqlite:///{tmp_path / 'gpufleet.db'}")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    if request.param == "sqlite":
        srv = start_server(f"sqlite:///{tmp_path / 'gpufleet.db'}")
        try:
            yield srv
        finally:
            stop_server(srv)
        return
    with scratch_postgres("schedproc") as url:
        srv = start_server(url)
        try:
            yield srv
        finally:
            stop_server(srv)


# -- the child under a real server --------------------------------------------------------------


def test_killed_child_is_restarted_and_schedules(any_server: Server) -> None:
    srv = any_server
    team, pool = make_team(srv), make_pool(srv)
    make_node(srv, pool=pool, gpus=4)
    first = eventually(lambda: scheduler_child(srv))
    submit_and_schedule(srv, pool=pool, team=team)

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = eventually(lambda: (c := scheduler_child(srv)) is not None and c.pid != first.pid and c)
    assert second.is_running()

    job = submit_and_schedule(srv, pool=pool, team=team)
    assert [e["actor"] for e in job["events"]][-1] == "scheduler"
    assert srv.proc.poll() is None  # the API process lived through it


def test_passes_reach_metrics(sqlite_server: Server) -> None:
    srv = sqlite_server
    team, pool = make_team(srv), make_pool(srv)
    make_node(srv, pool=pool, gpus=1)
    before = eventually(lambda: scheduling_passes(srv))  # the first pass runs at start
    submit_and_schedule(srv, pool=pool, team=team)
    after = eventually(lambda: (n := scheduling_passes(srv)) > before and n)
    assert after > before


def test_child_exits_when_server_is_killed(sqlite_server: Server) -> None:
    srv = sqlite_server
    child = eventually(lambda: scheduler_child(srv))
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    try:
        child.wait(5)  # stdin's EOF ends it
    except psutil.TimeoutExpired:
        child.kill()
        pytest.fail("the scheduler process outlived the killed server by 5 s")
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE


# -- the report of a pass -----------------------------------------------------------------------


def _job(jid: str, *, gpus: int, pool: str, queued: float) -> JobRequest:
    """Submitted at 0, queued (again) since ``queued``: the report carries the latter."""
    return JobRequest(
        id=jid, gpus=gpus, submit_time=0.0, pending_since=queued, pool=pool, user="ann", team="ml", priority=3
    )


@pytest.mark.parametrize(
    ("starts", "pending"),
    [
        ([], [_job("1", gpus=1, pool="default", queued=5.0)]),
        (
            [Start(job_id="2", placement=(NodeGpus(node="n1", gpus=(0, 1)),))],
            [_job("2", gpus=2, pool="default", queued=3.0), _job("3", gpus=8, pool="default", queued=4.0)],
        ),
        (
            [
                Start(
                    job_id="4", placement=(NodeGpus(node="n1", gpus=(2, 3)), NodeGpus(node="n2", gpus=(0, 1)))
                ),
                Start(job_id="5", placement=(NodeGpus(node="n3", gpus=(7,)),)),
            ],
            [_job("4", gpus=3, pool="big", queued=1.5), _job("5", gpus=1, pool="small", queued=2.5)],
        ),
    ],
    ids=["no-starts", "one-start-one-waits", "gang-and-single"],
)
def test_report_round_trip(starts: list[Start], pending: list[JobRequest]) -> None:
    snapshot = Snapshot(now=100.0, fleet=Fleet(nodes=()), pending=tuple(pending))
    plan = Plan(policy="default", starts=tuple(starts), fragmentation=0.25, free_gpus=6)
    report = json.loads(
        json.dumps(pass_report(passes=7, failures=2, snapshot=snapshot, plan=plan, seconds=0.5))
    )
    assert (report["passes"], report["failures"]) == (7, 2)

    got = summary(report)
    assert got is not None
    snap, back, seconds = got
    assert seconds == 0.5
    assert snap.now == 100.0
    assert back.policy == "default"
    assert (back.fragmentation, back.free_gpus) == (0.25, 6)
    assert back.starts == tuple(starts)
    started = {s.job_id for s in starts}
    want = [(j.id, j.gpus, j.pool, j.queued_since) for j in pending if j.id in started]
    assert [(j.id, j.gpus, j.pool, j.queued_since) for j in snap.pending] == want


def test_counters_only_report_has_no_summary() -> None:
    report = json.loads(json.dumps(pass_report(passes=3, failures=1)))
    assert report == {"passes": 3, "failures": 1}
    assert summary(report) is None


def test_start_of_a_job_not_in_the_snapshot_is_left_out() -> None:
    """A start whose job is not among the snapshot's pending (it cannot happen in a pass;
    the report must still be well formed) is not reported."""
    snapshot = Snapshot(now=1.0, fleet=Fleet(nodes=()), pending=())
    plan = Plan(policy="default", starts=(Start(job_id="9", placement=(NodeGpus(node="n", gpus=(0,)),)),))
    got = summary(json.loads(json.dumps(pass_report(passes=1, failures=0, snapshot=snapshot, plan=plan))))
    assert got is not None
    assert got[1].starts == ()
