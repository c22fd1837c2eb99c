"""Job arrays and dependencies through the API (Slurm's ``--array`` and
``--dependency``): one submit makes every task, ``%N`` holds the rest back with Slurm's
reason, a dependency keeps a job out of the queue until it holds (reasons
``Dependency`` / ``DependencyNeverSatisfied``, the latter cancelled with
``kill_on_invalid_dep``), bad specs and other users' jobs are 4xx, and ``POST
/v1/jobs/cancel`` cancels a whole array. Nodes registered without agents: placed jobs
stay SCHEDULED, which holds their GPUs."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server.conftest import ADMIN_TOKEN, Server, make_node, make_pool, make_team, make_user, ok, wait_for


def submit(srv: Server, token: str = ADMIN_TOKEN, status: int = 201, **spec: Any) -> Any:
    with srv.client(token) as c:
        return ok(c.post("/jobs", json={"command": ["true"], "gpus": 1, **spec}), status)


def job(srv: Server, jid: int, token: str = ADMIN_TOKEN) -> Any:
    with srv.client(token) as c:
        return ok(c.get(f"/jobs/{jid}"))


def until(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def array_jobs(srv: Server, array: int) -> list[Any]:
    with srv.client() as c:
        page = ok(c.get("/jobs", params={"limit": 1000}))
    return [j for j in page["items"] if j["array_job_id"] == array]


def test_an_array_makes_every_task_and_runs_at_most_its_limit(server: Server, team: str) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=8)
    first = submit(server, pool=pool, team=team, name="sweep", array="0-9:3,20%2")
    array = first["array_job_id"]
    assert array == first["id"] and first["array_task_id"] == 0
    tasks = array_jobs(server, array)
    assert [t["array_task_id"] for t in tasks] == [0, 3, 6, 9, 20] and {t["name"] for t in tasks} == {"sweep"}

    def settled() -> bool:
        states = [t["state"] for t in array_jobs(server, array)]
        return states.count("SCHEDULED") == 2 and states.count("PENDING") == 3

    until(settled)
    time.sleep(0.5)  # another pass or two: still only 2, though 6 GPUs are free
    assert settled()
    waiting = [t for t in array_jobs(server, array) if t["state"] == "PENDING"]
    assert all(t["wait_reason"].startswith("JobArrayTaskLimit") for t in waiting), waiting
    with server.client() as c:
        out = ok(c.post("/jobs/cancel", json={"array": array}))
    assert sorted(out["cancelled"]) == sorted(t["id"] for t in tasks)
    assert {t["state"] for t in array_jobs(server, array)} == {"CANCELLED"}


def test_a_dependency_holds_a_job_until_it_is_satisfied(server: Server, team: str) -> None:
    pool = make_pool(server)
    empty = make_pool(server)  # no nodes: a job there waits for ever
    make_node(server, pool=pool, gpus=2)
    first = submit(server, pool=empty, team=team)
    after_ok = submit(server, pool=pool, team=team, dependency=f"afterok:{first['id']}")
    after_any = submit(server, pool=pool, team=team, dependency=f"afterany:{first['id']}")
    killed = submit(
        server, pool=pool, team=team, dependency=f"afterok:{first['id']}", kill_on_invalid_dep=True
    )
    until(lambda: (job(server, after_ok["id"])["wait_reason"] or "").startswith("Dependency: afterok"))
    assert job(server, after_ok["id"])["dependency"] == f"afterok:{first['id']}"
    assert job(server, after_ok["id"])["queue_position"] is None
    with server.client() as c:
        ok(c.post(f"/jobs/{first['id']}/cancel"))
    wait_for(server, after_any["id"], "SCHEDULED")  # ended, however: afterany holds
    wait_for(server, killed["id"], "CANCELLED")
    until(lambda: (job(server, after_ok["id"])["wait_reason"] or "").startswith("DependencyNeverSatisfied"))
    assert job(server, after_ok["id"])["state"] == "PENDING"
    events = job(server, killed["id"])["events"]
    assert "kill_on_invalid_dep" in events[-1]["reason"] and events[-1]["actor"] == "scheduler"


def test_afterok_starts_the_job_once_its_predecessor_completed(server: Server, team: str) -> None:
    """The predecessor completes through a node's sync (an operator's token speaks for
    the node): then the dependent job is placed."""
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=1)
    pred = submit(server, pool=pool, team=team)
    nxt = submit(server, pool=pool, team=team, dependency=f"afterok:{pred['id']}")
    placed = wait_for(server, pred["id"], "SCHEDULED")
    attempt = round(placed["scheduled_at"] * 1000)
    with server.client() as c:
        gpus = [{"index": 0, "model": "H100", "uuid": f"GPU-{node}-0"}]
        seen = [{"job_id": pred["id"], "attempt": attempt, "state": "exited", "exit_code": 0}]
        ok(c.post(f"/nodes/{node}/sync", json={"gpus": gpus, "jobs": seen}))
    wait_for(server, pred["id"], "COMPLETED")
    wait_for(server, nxt["id"], "SCHEDULED")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"array": "5-1"}, "goes down"),
        ({"array": "x"}, "not an index"),
        ({"array": "0-20000"}, "at most 10000 tasks"),
        ({"array": "0-3%0"}, "limit"),
        ({"dependency": "afterok:999999999"}, "no job 999999999 of yours"),
        ({"dependency": "after:1+5"}, "delay"),
        ({"dependency": "aftercorr:1"}, "not supported"),
        ({"dependency": "before:1"}, "unknown type"),
    ],
)
def test_bad_arrays_and_dependencies_are_422_and_change_nothing(
    server: Server, team: str, spec: dict[str, Any], words: str
) -> None:
    before = server.counts()
    with server.client() as c:
        resp = c.post("/jobs", json={"command": ["true"], "team": team, **spec})
    assert resp.status_code == 422, resp.text
    assert words in resp.json()["detail"]
    assert server.counts() == before


def test_nobody_depends_on_or_cancels_another_users_jobs(server: Server, team: str) -> None:
    pool = make_pool(server)
    alice, bob = make_user(server, team=team), make_user(server, team=team)
    theirs = submit(server, alice, pool=pool, team=team, array="0-2")
    with server.client(bob) as c:
        resp = c.post(
            "/jobs", json={"command": ["true"], "team": team, "dependency": f"afterok:{theirs['id']}"}
        )
        assert resp.status_code == 422 and "of yours" in resp.json()["detail"]
        out = ok(c.post("/jobs/cancel", json={"array": theirs["array_job_id"]}))
        assert out["cancelled"] == []
        assert c.post("/jobs/cancel", json={"user": "admin"}).status_code == 403
        assert c.post("/jobs/cancel", json={}).status_code == 422
    assert {t["state"] for t in array_jobs(server, theirs["array_job_id"])} == {"PENDING"}


def _collapsed(srv: Server, array: int, token: str = ADMIN_TOKEN) -> list[Any]:
    with srv.client(token) as c:
        page = ok(c.get("/jobs", params={"array": array, "arrays": "collapsed", "limit": 1000}))
    return [(j["state"], j["array_task_id"], j["array_tasks"], j["array_task_count"]) for j in page["items"]]


def test_a_large_array_holds_releases_lists_and_cancels_one_request_each(server: Server, team: str) -> None:
    """Issue 35: a 2,000-task array is one statement per state change (``bulkjobs``), one
    item per waiting state in the collapsed list, and every task has its events."""
    pool = make_pool(server)  # no node: nothing starts
    first = submit(server, pool=pool, team=team, name="sweep", array="0-1999", hold=True)
    array = first["array_job_id"]
    assert _collapsed(server, array) == [("HELD", 0, "0-1999", 2000)]
    with server.client() as c:
        ids: dict[int, int] = {}
        for offset in (0, 1000):  # two pages of 1,000
            page = ok(c.get("/jobs", params={"array": array, "limit": 1000, "offset": offset}))
            ids |= {t["array_task_id"]: t["id"] for t in page["items"]}
        assert len(ids) == 2000
        out = ok(c.post("/jobs/release", json={"ids": [ids[t] for t in (3, 4, 5, 10)]}))
        assert out == {"changed": [ids[t] for t in (3, 4, 5, 10)], "skipped": []}
        folded = [("HELD", 0, "0-2,6-9,11-1999", 1996), ("PENDING", 3, "3-5,10", 4)]
        assert _collapsed(server, array) == folded
        out = ok(c.post("/jobs/hold", json={"array": array}))
        assert len(out["changed"]) == 4 and len(out["skipped"]) == 1996  # those were held already
        out = ok(c.post("/jobs/update", json={"array": array, "set": {"name": "sweep2", "time_limit": "1h"}}))
        assert len(out["changed"]) == 2000 and out["skipped"] == []
        out = ok(c.post("/jobs/cancel", json={"array": array}))
        assert sorted(out["cancelled"]) == sorted(ids.values()) and out["skipped"] == []
        left = ok(c.get("/jobs", params={"array": array, "state": "PENDING,HELD,SCHEDULED,RUNNING"}))
        assert left["items"] == []
        last = ok(c.get(f"/jobs/{ids[1999]}"))
        moved = ok(c.get(f"/jobs/{ids[4]}"))
    assert (last["state"], last["name"], last["time_limit_s"]) == ("CANCELLED", "sweep2", 3600)
    assert [(e["from_state"], e["to_state"]) for e in last["events"]][-2:] == [
        ("HELD", "HELD"),
        ("HELD", "CANCELLED"),
    ]
    assert [e["to_state"] for e in moved["events"]] == ["HELD", "PENDING", "HELD", "HELD", "CANCELLED"]
    assert moved["events"][-1]["reason"] == "cancelled by admin" and moved["ended_at"] is not None


def test_bulk_changes_touch_only_your_own_jobs_and_need_a_match(server: Server, team: str) -> None:
    pool = make_pool(server)
    alice, bob = make_user(server, team=team), make_user(server, team=team)
    theirs = submit(server, alice, pool=pool, team=team, array="0-4", hold=True)
    array = theirs["array_job_id"]
    with server.client(bob) as c:
        assert ok(c.post("/jobs/release", json={"array": array})) == {"changed": [], "skipped": []}
        assert c.post("/jobs/hold", json={"user": "admin"}).status_code == 403
        assert c.post("/jobs/release", json={}).status_code == 422
        assert c.post("/jobs/update", json={"array": array, "set": {}}).status_code == 422
        assert c.get("/jobs", params={"arrays": "folded"}).status_code == 422
    assert _collapsed(server, array, alice) == [("HELD", 0, "0-4", 5)]
    assert _collapsed(server, array, bob) == []


def test_holding_and_renaming_an_array_at_once_changes_each_task_once(server: Server, team: str) -> None:
    pool = make_pool(server)  # no node: nothing starts
    first = submit(server, pool=pool, team=team, array="0-4")
    array = first["array_job_id"]
    with server.client() as c:
        out = ok(c.post("/jobs/update", json={"array": array, "set": {"held": True, "name": "renamed"}}))
        assert len(out["changed"]) == 5 and out["changed"] == sorted(set(out["changed"]))  # each id once
        moved = ok(c.get(f"/jobs/{array}"))
    assert [(e["from_state"], e["to_state"]) for e in moved["events"]] == [
        (None, "PENDING"),
        ("PENDING", "HELD"),
    ]
    assert (moved["state"], moved["name"]) == ("HELD", "renamed")
