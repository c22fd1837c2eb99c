"""Run times predicted from the server's own history (issue 33), on a running server:
jobs of one name by one user end with known run times; the next job of that name gets
its prediction from them (a cancelled one teaches nothing), and ``GET /v1/jobs/{id}``,
the job list and ``gpufleet jobs show`` give a running job's predicted end and its
basis, a pending one's predicted run. Nodes are played through the sync endpoint."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import update

from gpufleet.cli.jobview import show_lines
from gpufleet.server.store.models import Job
from server.conftest import Server, make_node, make_pool, make_team, ok, unique, wait_for


def submit(server: Server, **spec: Any) -> int:
    with server.client() as c:
        body = {"command": ["python", "eval.py"], "gpus": 1, **spec}
        return int(ok(c.post("/jobs", json=body), 201)["id"])


def show(server: Server, jid: int) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.get(f"/jobs/{jid}"))  # type: ignore[no-any-return]


def ended(server: Server, ids: list[int], *, state: str, ran: float) -> None:
    """Held jobs written as having ended just now after running ``ran`` seconds (as a
    sync's exit would write them; the watermark reads what ended since its last pass)."""
    now = time.time()
    with server.engine.begin() as c:
        c.execute(
            update(Job)
            .where(Job.id.in_(ids))
            .values(state=state, started_at=now - ran, ended_at=now, executed_s=ran, version=Job.version + 1)
        )


def test_a_job_gets_its_predicted_end_from_the_jobs_like_it_that_ended(server: Server) -> None:
    team, pool = make_team(server), make_pool(server)
    node = make_node(server, pool=pool, gpus=1)
    name = unique("nightly-eval")
    spec = {"name": name, "team": team, "pool": pool, "time_limit": 7200}
    done = [submit(server, hold=True, **spec) for _ in range(3)]
    cancelled = submit(server, hold=True, **spec)
    ended(server, done[:2], state="COMPLETED", ran=600.0)
    ended(server, done[2:], state="FAILED", ran=900.0)
    ended(server, [cancelled], state="CANCELLED", ran=50_000.0)  # someone's patience: not a run time

    jid = submit(server, **spec)
    at = round(wait_for(server, jid, "SCHEDULED")["scheduled_at"] * 1000)
    with server.client() as c:
        ok(c.post(f"/nodes/{node}/sync", json={"jobs": [{"job_id": jid, "state": "running", "attempt": at}]}))
    job = wait_for(server, jid, "RUNNING")
    waiting = submit(server, **spec)  # the only GPU is taken: it waits
    try:
        assert job["predicted_s"] == pytest.approx(600.0)  # the median of 600, 600, 900
        assert job["prediction_basis"] == "user+name+gpus (3 jobs)"
        assert 0 < job["prediction_confidence"] <= 1
        assert job["predicted_end"] == pytest.approx(job["started_at"] + 600.0)
        with server.client() as c:  # the list (``gpufleet queue``, the fleet page) says it too
            listed = ok(c.get("/jobs", params={"team": team, "state": "RUNNING"}))["items"]
        assert [(j["id"], j["predicted_end"], j["prediction_basis"]) for j in listed] == [
            (jid, job["predicted_end"], job["prediction_basis"])
        ]
        lines = show_lines(job, now=job["started_at"] + 60)
        assert any(
            line.strip().startswith("predicted end: in 9m") and "user+name+gpus (3 jobs)" in line
            for line in lines
        ), lines
        pending = show(server, waiting)
        for _ in range(200):  # the pass after its submit predicts it
            if pending["predicted_s"] is not None:
                break
            time.sleep(0.02)
            pending = show(server, waiting)
        assert pending["state"] == "PENDING" and pending["predicted_end"] is None
        assert pending["predicted_s"] == pytest.approx(600.0)
        assert any(
            line.strip().startswith("predicted run: 10m") for line in show_lines(pending, now=time.time())
        )
    finally:
        with server.client() as c:
            for j in (jid, waiting):
                c.post(f"/jobs/{j}/cancel")
