"""End to end on the real server: register nodes, submit, see placements, play the
node agent through the sync endpoint, watch the job's event history."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server.conftest import Server, make_node, make_pool, make_team, ok, wait_for


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def submit(server: Server, **spec: Any) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.post("/jobs", json={"command": ["python", "train.py"], **spec}), 201)  # type: ignore[no-any-return]


def sync(server: Server, node: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.post(f"/nodes/{node}/sync", json={"jobs": jobs}))  # type: ignore[no-any-return]


def transitions(job: dict[str, Any]) -> list[tuple[str | None, str]]:
    return [(e["from_state"], e["to_state"]) for e in job["events"]]


def test_lifecycle_schedule_run_complete(server: Server, team: str) -> None:
    pool = make_pool(server)
    n1, n2 = make_node(server, pool=pool, gpus=4), make_node(server, pool=pool, gpus=4)
    a = submit(server, gpus=4, pool=pool, team=team)
    b = submit(server, gpus=2, pool=pool, team=team)
    ja = wait_for(server, a["id"], "SCHEDULED")
    jb = wait_for(server, b["id"], "SCHEDULED")
    assert ja["allocation"] == [{"node": n1, "gpus": [0, 1, 2, 3]}]
    assert jb["allocation"] == [{"node": n2, "gpus": [0, 1]}]

    desired = sync(server, n1, [])
    assert [(d["job_id"], d["gpus"]) for d in desired["jobs"]] == [(a["id"], [0, 1, 2, 3])]
    assert desired["jobs"][0]["command"] == ["python", "train.py"]
    for _ in range(2):  # a duplicate message is harmless
        sync(server, n1, [{"job_id": a["id"], "state": "running"}])
    assert wait_for(server, a["id"], "RUNNING")["started_at"] is not None
    for _ in range(2):
        reply = sync(server, n1, [{"job_id": a["id"], "state": "exited", "exit_code": 0}])
    assert reply["jobs"] == []
    done = wait_for(server, a["id"], "COMPLETED")
    assert done["exit_code"] == 0 and done["allocation"] == []
    assert transitions(done) == [
        (None, "PENDING"),
        ("PENDING", "SCHEDULED"),
        ("SCHEDULED", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]
    assert done["attained_service_s"] >= 0

    sync(server, n2, [{"job_id": b["id"], "state": "exited", "exit_code": 3}])
    assert wait_for(server, b["id"], "FAILED")["exit_code"] == 3


def test_queue_position_and_reason(server: Server, team: str) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=2)
    first = submit(server, gpus=2, pool=pool, team=team, time_limit="1h")
    wait_for(server, first["id"], "SCHEDULED")
    waiting = [submit(server, gpus=2, pool=pool, team=team) for _ in range(2)]
    deadline = time.monotonic() + 5
    while True:
        with server.client() as c:
            jobs = [ok(c.get(f"/jobs/{w['id']}")) for w in waiting]
        if all(j["queue_position"] is not None for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # Positions are fleet-wide (one queue across pools): consecutive here.
    assert jobs[1]["queue_position"] == jobs[0]["queue_position"] + 1
    assert jobs[0]["wait_reason"].startswith("Resources")
    assert jobs[0]["estimated_start"] == pytest.approx(first["submit_time"] + 3600, abs=5)
    with server.client() as c:
        ok(c.post(f"/jobs/{first['id']}/cancel"))
    wait_for(server, waiting[0]["id"], "SCHEDULED")


def test_hold_release_cancel(server: Server, team: str) -> None:
    pool = make_pool(server)
    job = submit(server, gpus=1, pool=pool, team=team)  # no nodes yet: stays PENDING
    with server.client() as c:
        assert ok(c.post(f"/jobs/{job['id']}/hold"))["state"] == "HELD"
        assert c.post(f"/jobs/{job['id']}/hold").status_code == 409
    node = make_node(server, pool=pool, gpus=1)
    time.sleep(0.3)
    with server.client() as c:
        assert ok(c.get(f"/jobs/{job['id']}"))["state"] == "HELD"
        ok(c.post(f"/jobs/{job['id']}/release"))
    wait_for(server, job["id"], "SCHEDULED")
    sync(server, node, [{"job_id": job["id"], "state": "running"}])
    with server.client() as c:
        cancelled = ok(c.post(f"/jobs/{job['id']}/cancel"))
        assert c.post(f"/jobs/{job['id']}/cancel").status_code == 409
    assert cancelled["state"] == "CANCELLED" and cancelled["allocation"] == []
    assert sync(server, node, [{"job_id": job["id"], "state": "running"}])["jobs"] == []
    assert transitions(cancelled)[-3:] == [
        ("PENDING", "SCHEDULED"),
        ("SCHEDULED", "RUNNING"),
        ("RUNNING", "CANCELLED"),
    ]
    assert [t for t in transitions(cancelled)[:3]] == [
        (None, "PENDING"),
        ("PENDING", "HELD"),
        ("HELD", "PENDING"),
    ]


def test_time_limit_gives_timeout(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=1)
    job = submit(server, gpus=1, pool=pool, team=team, time_limit="1s")
    wait_for(server, job["id"], "SCHEDULED")
    sync(server, node, [{"job_id": job["id"], "state": "running"}])
    done = wait_for(server, job["id"], "TIMEOUT", timeout=5)
    assert done["events"][-1]["actor"] == "scheduler"
    assert done["attained_service_s"] >= 1.0
    assert sync(server, node, [])["jobs"] == []


def test_priority_preempts_lower_job(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=2)
    low = submit(server, gpus=2, pool=pool, team=team, priority=0)
    wait_for(server, low["id"], "SCHEDULED")
    sync(server, node, [{"job_id": low["id"], "state": "running"}])
    wait_for(server, low["id"], "RUNNING")
    high = submit(server, gpus=2, pool=pool, team=team, priority=100)
    back = wait_for(server, low["id"], "PENDING", timeout=5)
    assert ("RUNNING", "PREEMPTED") in transitions(back) and ("PREEMPTED", "PENDING") in transitions(back)
    wait_for(server, high["id"], "SCHEDULED")
    # The preempted job waits until its old node confirms it stopped.
    reply = sync(server, node, [{"job_id": low["id"], "state": "running"}])
    assert [d["job_id"] for d in reply["jobs"]] == [high["id"]]
    sync(server, node, [{"job_id": high["id"], "state": "running"}])
    with server.client() as c:
        assert ok(c.get(f"/jobs/{low['id']}"))["state"] == "PENDING"


def test_cpu_job_runs_in_cpu_pool(server: Server, team: str) -> None:
    pool = make_pool(server, gpu=False)
    node = make_node(server, pool=pool, gpus=0)
    job = submit(server, gpus=0, pool=pool, team=team)
    scheduled = wait_for(server, job["id"], "SCHEDULED")
    assert scheduled["allocation"] == [{"node": node, "gpus": []}]
    assert [d["job_id"] for d in sync(server, node, [])["jobs"]] == [job["id"]]


def test_list_filters_and_cursor_paging(server: Server, team: str) -> None:
    pool = make_pool(server)
    ids = [submit(server, gpus=1, pool=pool, team=team)["id"] for _ in range(5)]
    seen: list[int] = []
    cursor = None
    with server.client() as c:
        while True:
            params: dict[str, Any] = {"pool": pool, "limit": 2, "state": "PENDING,HELD"}
            if cursor:
                params["cursor"] = cursor
            page = ok(c.get("/jobs", params=params))
            seen += [j["id"] for j in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == ids
        assert [j["id"] for j in ok(c.get("/jobs", params={"pool": pool, "offset": 3}))["items"]] == ids[3:]
        assert ok(c.get("/jobs", params={"pool": pool, "state": "RUNNING"}))["items"] == []
