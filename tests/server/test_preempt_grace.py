"""Checkpoint-aware preemption on a running server (issue 33): a preempted job that asked
``--signal=B:SIG@T`` gets the signal (its node's sync hands it a deadline at the grace's
end) and T seconds before it is stopped and requeued; its preemptor waits meanwhile; a
job that exits during its grace counts as preempted, not failed; ``checkpoint_every`` is
stored, and a bad one is a 422 that stores nothing. Nodes here are played through the
sync endpoint; ``test_preempt_grace_agent.py`` runs a real agent."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import func, select, text

from server.conftest import Server, make_node, make_pool, make_team, ok, wait_for


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def submit(server: Server, **spec: Any) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.post("/jobs", json={"command": ["python", "train.py"], "gpus": 1, **spec}), 201)  # type: ignore[no-any-return]


def sync(server: Server, node: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.post(f"/nodes/{node}/sync", json={"jobs": jobs}))  # type: ignore[no-any-return]


def job(server: Server, jid: int) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.get(f"/jobs/{jid}"))  # type: ignore[no-any-return]


def cancel(server: Server, *ids: int) -> None:
    """Leave nothing waiting behind: the fleet has one queue across pools, and a job left
    pending ahead of another file's jobs moves their estimated starts."""
    with server.client() as c:
        for jid in ids:
            c.post(f"/jobs/{jid}/cancel")


def running(server: Server, node: str, spec: dict[str, Any]) -> tuple[int, int]:
    """A job submitted and confirmed RUNNING on ``node``: (id, attempt)."""
    jid = submit(server, **spec)["id"]
    at = round(wait_for(server, jid, "SCHEDULED")["scheduled_at"] * 1000)
    sync(server, node, [{"job_id": jid, "state": "running", "attempt": at}])
    wait_for(server, jid, "RUNNING")
    return jid, at


def test_a_victim_that_asked_a_signal_gets_its_grace_then_is_requeued(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=2)
    low, at = running(server, node, {"gpus": 2, "pool": pool, "team": team, "signal": "B:USR1@3"})
    high = submit(server, gpus=2, pool=pool, team=team, priority=100)["id"]
    t0 = time.time()
    deadline = time.monotonic() + 5
    while not (got := job(server, low))["events"][-1]["reason"].startswith(f"preempted for job {high}"):
        assert time.monotonic() < deadline, got["events"]
        time.sleep(0.05)
    assert got["state"] == "RUNNING"  # in its grace: it keeps its GPUs
    said = got["events"][-1]
    assert (said["from_state"], said["to_state"]) == ("RUNNING", "RUNNING")
    assert "loses" in said["reason"] and "(3s grace, --signal=B:USR1@3)" in said["reason"]
    # The node is told: the job's deadline is the grace's end (its agent signals it now).
    desired = {
        d["job_id"]: d
        for d in sync(server, node, [{"job_id": low, "state": "running", "attempt": at}])["jobs"]
    }
    assert list(desired) == [low]
    assert desired[low]["signal"] == "B:USR1@3"
    assert t0 <= desired[low]["deadline"] <= time.time() + 3
    while (waiting := job(server, high))["wait_reason"] is None:  # the next pass says why
        assert time.monotonic() < deadline + 2
        time.sleep(0.05)
    assert waiting["state"] == "PENDING"
    assert waiting["wait_reason"] == f"Resources: job(s) {low} preempted for it, in their grace"
    assert waiting["estimated_start"] == pytest.approx(desired[low]["deadline"], abs=0.2)
    back = wait_for(server, low, "PENDING", timeout=8)
    assert time.time() - t0 >= 2.5  # not before its grace was over
    assert [(e["from_state"], e["to_state"]) for e in back["events"][-2:]] == [
        ("RUNNING", "PREEMPTED"),
        ("PREEMPTED", "PENDING"),
    ]
    assert back["events"][-1]["reason"].endswith("; its grace is over")
    # As any preempted job: its old node confirms the stop, then the preemptor runs there.
    sync(server, node, [])
    wait_for(server, high, "SCHEDULED", timeout=5)
    cancel(server, low, high)


def test_a_victim_that_exits_in_its_grace_is_preempted_not_failed(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=1)
    low, at = running(server, node, {"pool": pool, "team": team, "signal": "USR1@30"})
    high = submit(server, pool=pool, team=team, priority=100)["id"]
    deadline = time.monotonic() + 5
    while (
        job(server, low)["events"][-1]["to_state"] != "RUNNING"
        or "grace" not in job(server, low)["events"][-1]["reason"]
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sync(server, node, [{"job_id": low, "state": "exited", "exit_code": 1, "attempt": at}])
    back = wait_for(server, low, "PENDING", timeout=5)
    assert back["exit_code"] is None
    assert "exited with code 1 on" in back["events"][-1]["reason"]
    assert back["events"][-1]["reason"].endswith("during its grace")
    assert ("RUNNING", "FAILED") not in [(e["from_state"], e["to_state"]) for e in back["events"]]
    wait_for(server, high, "SCHEDULED", timeout=5)  # its node confirmed with the exit
    cancel(server, low, high)


def test_a_victim_without_a_signal_is_stopped_at_once(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=1)
    low, _ = running(server, node, {"pool": pool, "team": team, "checkpoint_every": "30m"})
    high = submit(server, pool=pool, team=team, priority=100)["id"]
    back = wait_for(server, low, "PENDING", timeout=5)
    assert "since its last checkpoint (every 1800s)" in back["events"][-1]["reason"]
    cancel(server, low, high)


@pytest.mark.parametrize(
    ("given", "stored"),
    [("30m", 1800.0), ("1h30m", 5400.0), (600, 600.0), (None, None)],
    ids=["minutes", "hours-minutes", "seconds", "none"],
)
def test_checkpoint_every_is_stored(server: Server, team: str, given: object, stored: float | None) -> None:
    pool = make_pool(server)
    spec = {"pool": pool, "team": team} | ({} if given is None else {"checkpoint_every": given})
    made = submit(server, **spec)
    assert made["checkpoint_s"] == stored
    assert job(server, made["id"])["checkpoint_s"] == stored
    cancel(server, made["id"])


@pytest.mark.parametrize("bad", ["abc", "0s", "31d", -5, "", "1e400"], ids=str)
def test_a_bad_checkpoint_every_is_a_422_and_no_row(server: Server, team: str, bad: object) -> None:
    pool = make_pool(server)
    with server.engine.connect() as conn:
        before = conn.execute(select(func.count()).select_from(text("jobs"))).scalar_one()
    with server.client() as c:
        resp = c.post(
            "/jobs",
            json={"command": ["true"], "gpus": 1, "pool": pool, "team": team, "checkpoint_every": bad},
        )
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert "checkpoint_every" in resp.json()["detail"]
    with server.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(text("jobs"))).scalar_one() == before


def test_a_drain_counts_down_a_jobs_signal(server: Server, team: str) -> None:
    """A drain (or a driver upgrade's) requeues what still runs at its deadline: a job that
    asked ``--signal`` is told that deadline (its agent signals it SECONDS before, to
    checkpoint), as it is told a time limit's end; a job on another node is not."""
    pools = make_pool(server), make_pool(server)
    node, other = make_node(server, pool=pools[0], gpus=1), make_node(server, pool=pools[1], gpus=1)
    spec = {"gpus": 1, "team": team, "signal": "B:USR1@300", "time_limit": "2h"}
    first, at = running(server, node, {**spec, "pool": pools[0]})
    second, at2 = running(server, other, {**spec, "pool": pools[1]})
    before = sync(server, node, [{"job_id": first, "state": "running", "attempt": at}])["jobs"][0]
    started = job(server, first)["started_at"]
    assert before["deadline"] == pytest.approx(started + 7200, abs=1)  # the time limit's end
    t0 = time.time()
    with server.client() as c:
        ok(c.post(f"/nodes/{node}/drain", json={"grace": "10m"}))
    after = sync(server, node, [{"job_id": first, "state": "running", "attempt": at}])["jobs"][0]
    assert after["signal"] == "B:USR1@300"
    assert t0 + 600 - 2 <= after["deadline"] <= time.time() + 600 + 2  # the drain's deadline, sooner
    untouched = sync(server, other, [{"job_id": second, "state": "running", "attempt": at2}])["jobs"][0]
    assert untouched["deadline"] == pytest.approx(job(server, second)["started_at"] + 7200, abs=1)
    with server.client() as c:
        ok(c.post(f"/nodes/{node}/uncordon"))
    cancel(server, first, second)
