"""``gpufleet history`` (sacct) against the real server: the window ``GET /v1/jobs``
takes (``since``/``until``: jobs in the system at some time in it; users see their
own), and ``--parsable2`` output read back by the simulator's sacct loader as the same
jobs: ids, GPUs, models and durations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.sim.loaders.sacct import load_sacct
from server.conftest import Server, gpufleet, make_pool, make_team, make_user, ok, wait_for
from server.playnode import attempt_of, register, sync


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def submit(srv: Server, token: str | None = None, **spec: Any) -> Any:
    with srv.client(token) if token else srv.client() as c:
        return ok(c.post("/jobs", json={"command": ["true"], "gpus": 1, **spec}), 201)


def listed(srv: Server, token: str | None = None, **params: Any) -> list[int]:
    with srv.client(token) if token else srv.client() as c:
        return [j["id"] for j in ok(c.get("/jobs", params={"limit": 1000, **params}))["items"]]


def test_the_window_holds_the_jobs_in_the_system_then(server: Server, team: str) -> None:
    pool = make_pool(server)
    early = submit(server, pool=pool, team=team)
    with server.client() as c:
        ended = ok(c.post(f"/jobs/{early['id']}/cancel"))["ended_at"]
    time.sleep(0.05)
    late = submit(server, pool=pool, team=team)
    assert listed(server, pool=pool, since=ended - 0.01) == [early["id"], late["id"]]
    assert listed(server, pool=pool, since=ended + 0.01) == [late["id"]]  # ended before it
    assert listed(server, pool=pool, until=late["submit_time"] - 0.01) == [early["id"]]  # not yet in
    assert listed(server, pool=pool, since=ended + 0.01, until=late["submit_time"] - 0.01) == []
    user = make_user(server, team=team)
    theirs = submit(server, user, pool=pool, team=team)
    assert listed(server, user, since=0) == [theirs["id"]]  # their own only, as ever
    with server.client() as c:
        assert c.get("/jobs", params={"since": "nan"}).status_code == 422


def test_parsable2_reads_back_as_the_same_jobs(server: Server, team: str, tmp_path: Path) -> None:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=4)
    start = time.time()
    jobs = [
        submit(server, pool=pool, team=team, gpus=2, gpu_type="H100", time_limit="1h"),
        submit(server, pool=pool, team=team, gpus=1, array="0-1", name="sweep"),
    ]
    ids = [jobs[0]["id"], jobs[1]["id"], jobs[1]["id"] + 1]
    placed = {jid: attempt_of(wait_for(server, jid, "SCHEDULED")) for jid in ids}
    sync(server, node, {"jobs": [{"job_id": j, "state": "running", "attempt": a} for j, a in placed.items()]},
         token=token)  # fmt: skip
    for jid, pause in zip(ids, (1.2, 0.0, 1.2), strict=True):
        time.sleep(pause)
        done = {"job_id": jid, "state": "exited", "attempt": placed[jid], "exit_code": 0}
        sync(server, node, {"jobs": [done]}, token=token)
        wait_for(server, jid, "COMPLETED")
    never = submit(server, pool=make_pool(server), team=team)
    with server.client() as c:
        ok(c.post(f"/jobs/{never['id']}/cancel"))
    fields = "JobID,User,Account,Partition,Submit,Start,End,Elapsed,Timelimit,AllocTRES,ReqTRES,NNodes,State"
    fields += ",Priority"  # the loader's docstring's export
    out = gpufleet("history", "-S", f"now-{round(time.time() - start) + 5}seconds", "-P", "--format", fields,
                   env=server.env())  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == fields.replace(",", "|")
    trace = tmp_path / "sacct.txt"
    trace.write_text(out.stdout)
    loaded = load_sacct(trace)
    with server.client() as c:
        api = {j["id"]: j for j in (ok(c.get(f"/jobs/{jid}")) for jid in ids)}
    want = {
        (f"{j['array_job_id']}_{j['array_task_id']}" if j["array_job_id"] else str(j["id"])): (
            j["gpus"],
            j["gpu_type"] and j["gpu_type"].lower(),
            float(round(j["ended_at"] - j["started_at"])),
        )
        for j in api.values()
    }
    got = {t.job_id: (t.gpus, t.gpu_type, t.duration_s) for t in loaded.jobs if t.team == team}
    assert got == want and {d for _, _, d in want.values()} >= {1.0}
    assert next(t for t in loaded.jobs if t.job_id == str(ids[0])).time_limit_s == 3600
    assert any(f"job {never['id']} never started" in str(p) for p in loaded.problems)
