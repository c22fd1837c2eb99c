"""Slurm's batch options through the API: CPUs and memory per node from --ntasks,
--cpus-per-task and the three --mem forms (with the pool's defaults), --begin and
--deadline as times, --signal in canonical form, the file options stored for the
agent; bad values and contradictions are 422 and change nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server.conftest import Server, make_pool, make_team, ok


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def submit(srv: Server, status: int = 201, **spec: Any) -> Any:
    with srv.client() as c:
        return ok(c.post("/jobs", json={"command": ["true"], "gpus": 1, **spec}), status)


@pytest.mark.parametrize(
    ("spec", "cpus", "mem"),
    [
        ({}, 0, 0),  # a GPU job asking nothing, in a pool without defaults
        ({"cpus_per_task": 4}, 4, 0),
        ({"ntasks": 8, "nodes": 2, "gpus": 2}, 4, 0),
        ({"ntasks_per_node": 2, "cpus_per_task": 3, "mem_per_cpu": "2G"}, 6, 6 * 2048),
        ({"mem": "16G"}, 0, 16384),
        ({"mem": 1000}, 0, 1000),
        ({"mem_per_gpu": "10G", "gpus": 2}, 0, 20480),
    ],
)
def test_cpus_and_memory_per_node(
    server: Server, team: str, spec: dict[str, Any], cpus: int, mem: int
) -> None:
    job = submit(server, pool=make_pool(server), team=team, **spec)
    assert (job["cpus_per_node"], job["mem_per_node_mb"]) == (cpus, mem)


def test_the_pools_defaults_apply_when_a_job_says_nothing(server: Server, team: str) -> None:
    pool = make_pool(server)
    with server.engine.begin() as c:
        c.exec_driver_sql(
            "UPDATE pools SET default_cpus_per_gpu = 8, default_mem_per_cpu_mb = 4096 WHERE name = ?"
            if server.db_url.startswith("sqlite")
            else "UPDATE pools SET default_cpus_per_gpu = 8, default_mem_per_cpu_mb = 4096 WHERE name = %s",
            (pool,),
        )
    job = submit(server, pool=pool, team=team, gpus=2)
    assert (job["cpus_per_node"], job["mem_per_node_mb"]) == (16, 16 * 4096)


def test_times_signal_and_files_are_kept(server: Server, team: str) -> None:
    now = time.time()
    job = submit(
        server,
        team=team,
        pool=make_pool(server),
        begin="now+1hour",
        deadline=now + 7200,
        time_limit="30m",
        signal="b:sigusr1@120",
        output="out-%j.txt",
        error="err-%j.txt",
        input="in.txt",
        workdir="/data/run",
        submit_dir="/home/alice",
        max_price=1.5,
    )
    assert abs(job["begin_at"] - (now + 3600)) < 60 and job["deadline"] == pytest.approx(now + 7200)
    assert job["signal"] == "B:USR1@120" and job["max_price"] == 1.5
    assert (job["output"], job["error"], job["input"]) == ("out-%j.txt", "err-%j.txt", "in.txt")
    assert (job["workdir"], job["submit_dir"]) == ("/data/run", "/home/alice")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"mem": "16G", "mem_per_cpu": "1G"}, "exclude each other"),
        ({"mem": "lots"}, "expected a size"),
        ({"mem_per_cpu": "0"}, "at least 1M"),  # (--mem=0 is all of each node's memory)
        ({"ntasks": 9, "ntasks_per_node": 2, "nodes": 2, "gpus": 2}, "ntasks (9)"),
        ({"begin": "someday"}, "begin: --begin=someday"),
        ({"deadline": 1.0}, "not after the job could start"),
        ({"begin": 1e18}, "not a time within"),
        ({"deadline": "now+60", "time_limit": "1h"}, "cannot end by it"),
        ({"signal": "R:USR1"}, "not supported"),
        ({"signal": "NOPE@5"}, "unknown signal"),
        ({"max_price": -1}, "greater than or equal"),
        ({"cpus_per_task": 0}, "greater than or equal"),
    ],
)
def test_bad_batch_options_are_422_and_change_nothing(
    server: Server, team: str, spec: dict[str, Any], words: str
) -> None:
    before = server.counts()
    with server.client() as c:
        resp = c.post("/jobs", json={"command": ["true"], "team": team, **spec})
    assert resp.status_code == 422, resp.text
    assert words in str(resp.json()), resp.json()
    assert server.counts() == before


def test_begin_holds_a_job_back_and_a_missed_deadline_cancels_it(server: Server, team: str) -> None:
    from server.conftest import make_node, wait_for

    pool = make_pool(server)
    make_node(server, pool=pool, gpus=2)
    later = submit(server, pool=pool, team=team, begin="now+3600")
    soon = submit(server, pool=pool, team=team, begin="now+1")
    doomed = submit(server, pool=make_pool(server), team=team, deadline="now+2", time_limit="1s")  # no nodes
    deadline = time.monotonic() + 10
    while True:
        with server.client() as c:
            job = ok(c.get(f"/jobs/{later['id']}"))
        if (job["wait_reason"] or "").startswith("BeginTime"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["estimated_start"] == pytest.approx(later["begin_at"]) and job["queue_position"] is None
    wait_for(server, soon["id"], "SCHEDULED")
    gone = wait_for(server, doomed["id"], "CANCELLED")
    assert gone["events"][-1]["reason"].startswith("Deadline: cannot end by")


def test_a_job_submitted_held_waits_until_released(server: Server, team: str) -> None:
    from server.conftest import make_node, wait_for

    pool = make_pool(server)
    make_node(server, pool=pool, gpus=1)
    held = submit(server, pool=pool, team=team, hold=True, array="0-1")
    assert held["state"] == "HELD" and held["events"][0]["to_state"] == "HELD"
    time.sleep(0.3)  # a pass or two: still held
    assert wait_for(server, held["id"], "HELD")["allocation"] == []
    with server.client() as c:
        ok(c.post(f"/jobs/{held['id']}/release"))
    wait_for(server, held["id"], "SCHEDULED")
