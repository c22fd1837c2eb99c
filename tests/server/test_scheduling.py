"""End to end on the real server: register nodes, submit, see placements, play the
node agent through the sync endpoint, watch the job's event history."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from server.conftest import Server, make_node, make_pool, make_team, make_user, ok, wait_for


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def submit(server: Server, **spec: Any) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.post("/jobs", json={"command": ["python", "train.py"], "gpus": 1, **spec}), 201)  # type: ignore[no-any-return]


def sync(server: Server, node: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.post(f"/nodes/{node}/sync", json={"jobs": jobs}))  # type: ignore[no-any-return]


def attempt(job: dict[str, Any]) -> int:
    """The attempt of the job's current placement, as its agent knows it (``DesiredJob.attempt``)."""
    return round(job["scheduled_at"] * 1000)


def transitions(job: dict[str, Any]) -> list[tuple[str | None, str]]:
    return [(e["from_state"], e["to_state"]) for e in job["events"]]


def test_lifecycle_schedule_run_complete(server: Server, team: str) -> None:
    pool = make_pool(server)
    n1, n2 = make_node(server, pool=pool, gpus=4), make_node(server, pool=pool, gpus=4)
    a = submit(server, gpus=4, pool=pool, team=team)
    b = submit(server, gpus=2, pool=pool, team=team)
    ja = wait_for(server, a["id"], "SCHEDULED")
    jb = wait_for(server, b["id"], "SCHEDULED")
    # Two equal nodes: either may take the 4-GPU job (placement ties go by node name, and
    # unique() names sort differently across a digit boundary); the other takes the rest.
    if ja["allocation"][0]["node"] == n2:
        n1, n2 = n2, n1
    assert ja["allocation"] == [{"node": n1, "gpus": [0, 1, 2, 3]}]
    assert jb["allocation"] == [{"node": n2, "gpus": [0, 1]}]

    desired = sync(server, n1, [])
    assert [(d["job_id"], d["gpus"]) for d in desired["jobs"]] == [(a["id"], [0, 1, 2, 3])]
    assert desired["jobs"][0]["command"] == ["python", "train.py"]
    at = desired["jobs"][0]["attempt"]
    assert at == attempt(ja)
    for _ in range(2):  # a duplicate message is harmless
        sync(server, n1, [{"job_id": a["id"], "state": "running", "attempt": at}])
    assert wait_for(server, a["id"], "RUNNING")["started_at"] is not None
    for _ in range(2):
        reply = sync(server, n1, [{"job_id": a["id"], "state": "exited", "exit_code": 0, "attempt": at}])
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

    sync(server, n2, [{"job_id": b["id"], "state": "exited", "exit_code": 3, "attempt": attempt(jb)}])
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
    at = attempt(wait_for(server, job["id"], "SCHEDULED"))
    sync(server, node, [{"job_id": job["id"], "state": "running", "attempt": at}])
    with server.client() as c:
        cancelled = ok(c.post(f"/jobs/{job['id']}/cancel"))
        assert c.post(f"/jobs/{job['id']}/cancel").status_code == 409
    assert cancelled["state"] == "CANCELLED" and cancelled["allocation"] == []
    assert sync(server, node, [{"job_id": job["id"], "state": "running", "attempt": at}])["jobs"] == []
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
    at = attempt(wait_for(server, job["id"], "SCHEDULED"))
    sync(server, node, [{"job_id": job["id"], "state": "running", "attempt": at}])
    done = wait_for(server, job["id"], "TIMEOUT", timeout=5)
    assert done["events"][-1]["actor"] == "scheduler"
    assert done["attained_service_s"] >= 1.0
    assert sync(server, node, [])["jobs"] == []


def test_priority_preempts_lower_job(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=2)
    low = submit(server, gpus=2, pool=pool, team=team, priority=0)
    low_at = attempt(wait_for(server, low["id"], "SCHEDULED"))
    sync(server, node, [{"job_id": low["id"], "state": "running", "attempt": low_at}])
    wait_for(server, low["id"], "RUNNING")
    high = submit(server, gpus=2, pool=pool, team=team, priority=100)
    back = wait_for(server, low["id"], "PENDING", timeout=5)
    assert ("RUNNING", "PREEMPTED") in transitions(back) and ("PREEMPTED", "PENDING") in transitions(back)
    high_at = attempt(wait_for(server, high["id"], "SCHEDULED"))
    # The preempted job waits until its old node confirms it stopped.
    reply = sync(server, node, [{"job_id": low["id"], "state": "running", "attempt": low_at}])
    assert [d["job_id"] for d in reply["jobs"]] == [high["id"]]
    sync(server, node, [{"job_id": high["id"], "state": "running", "attempt": high_at}])
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


# One submit path (``routers/jobs.SubmitRoute``) whatever the content type's parameters:
# plain JSON and JSON with a charset must answer the same (it once had two doors).
FAST = {"content-type": "application/json"}
ROUTED = {"content-type": "application/json; charset=utf-8"}  # not the plain case: the route


def _post_job(server: Server, headers: dict[str, str], spec: dict[str, Any]) -> httpx.Response:
    with server.client() as c:
        ok(c.get("/jobs", params={"limit": 1}))  # the token is in the cache now (the plain case)
        return c.post("/jobs", content=json.dumps(spec).encode(), headers=headers)


def _comparable(job: dict[str, Any]) -> dict[str, Any]:
    varying = {"id", "submit_time", "events"}
    return {k: v for k, v in job.items() if k not in varying} | {
        "events": [{k: v for k, v in e.items() if k != "at"} for e in job["events"]]
    }


def test_plain_and_charset_submissions_answer_the_same(server: Server, team: str) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=2)
    spec = {"command": ["python", "train.py"], "gpus": 1, "pool": pool, "team": team, "time_limit": "2h"}
    fast, routed = _post_job(server, FAST, spec), _post_job(server, ROUTED, spec)
    assert (fast.status_code, routed.status_code) == (201, 201)
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert _comparable(fast.json()) == _comparable(routed.json())
    with server.client() as c:
        shown = ok(c.get(f"/jobs/{fast.json()['id']}"))
    assert {k: shown[k] for k in ("command", "time_limit_s", "team", "pool")} == {
        k: fast.json()[k] for k in ("command", "time_limit_s", "team", "pool")
    }
    for job in (fast.json(), routed.json()):
        wait_for(server, job["id"], "SCHEDULED")


@pytest.mark.parametrize(
    ("spec", "status"),
    [
        ({"command": ["x"], "pool": "no-such-pool"}, 422),  # the service refuses it
        ({"command": ["x"], "team": "no-such-team"}, 422),
        ({"command": ["x"], "gpus": "many"}, 422),  # invalid body: the route's validation error
        ({"command": ["x"], "time_limit": "soon"}, 422),
    ],
    ids=["unknown-pool", "unknown-team", "invalid-body", "bad-time-limit"],
)
def test_plain_and_charset_refusals_are_the_same_problem(
    server: Server, team: str, spec: dict[str, Any], status: int
) -> None:
    before = server.counts()
    spec = {"team": team} | spec
    fast, routed = _post_job(server, FAST, spec), _post_job(server, ROUTED, spec)
    assert (fast.status_code, routed.status_code) == (status, status)
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/problem+json"
    assert fast.json() == routed.json()
    assert server.counts() == before


def test_new_token_is_served_then_cached(server: Server, team: str) -> None:
    """A token the cache does not know yet goes the route's way (database look-up);
    its next submission is a plain one. Both are the same user's."""
    token = make_user(server, team=team)
    spec = {"command": ["x"], "gpus": 1, "pool": make_pool(server), "team": team}
    with server.client(token) as c:
        first, second = (ok(c.post("/jobs", json=spec), 201) for _ in range(2))
    assert first["user"] == second["user"] != "admin"
