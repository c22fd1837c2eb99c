"""A preemption that honours ``--signal`` with a real ``gpufleet agent`` (as root, the job
as an unprivileged account, simulated GPUs): the victim's batch shell receives SIGUSR1 as
soon as a higher-priority job preempts it, checkpoints (here: says so) and exits during
its grace, and is requeued, not failed; the preemptor then runs on its GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobaccounts import ROOT
from server.conftest import Server, make_team, ok, wait_for
from server.test_diagnosis_e2e import Agent

pytestmark = pytest.mark.skipif(not ROOT, reason="a root agent runs jobs as another account")

VICTIM = "trap 'echo got-USR1; exit 3' USR1; echo started; while :; do sleep 0.2; done"


@pytest.fixture
def agent(server: Server, tmp_path: Path) -> Iterator[Agent]:
    if not server.db_url.startswith("sqlite"):  # the grace itself: test_preempt_grace.py, both
        pytest.skip("a real agent's flow is the same on both databases: once, on SQLite")
    a = Agent(server, tmp_path, gpus=1)
    yield a
    a.close()


def log_of(server: Server, job: int, want: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    with server.client() as c:
        while want not in (got := c.get(f"/jobs/{job}/logs").text):
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
    return got


def test_the_victim_gets_sigusr1_and_its_grace_and_is_requeued(server: Server, agent: Agent) -> None:
    team = make_team(server)
    base = {"pool": agent.pool, "team": team, "gpus": 1}
    with server.client() as c:
        spec = base | {"command": ["bash", "-c", VICTIM], "signal": "B:USR1@5", "checkpoint_every": "30m"}
        low = int(ok(c.post("/jobs", json=spec), 201)["id"])
        wait_for(server, low, "RUNNING", timeout=30)
        log_of(server, low, "started")
        high = int(ok(c.post("/jobs", json=base | {"command": ["sleep", "30"], "priority": 100}), 201)["id"])
    t0 = time.monotonic()
    assert "got-USR1" in log_of(server, low, "got-USR1", timeout=10)
    assert time.monotonic() - t0 < 5  # signalled at once, not at the grace's end
    back = wait_for(server, low, "PENDING", timeout=10)
    reasons = [e["reason"] for e in back["events"]]
    assert any("(5s grace, --signal=B:USR1@5)" in r and f"preempted for job {high}" in r for r in reasons)
    assert back["events"][-1]["reason"].endswith("during its grace")
    assert "exited with code 3" in back["events"][-1]["reason"]
    assert all(e["to_state"] != "FAILED" for e in back["events"])
    wait_for(server, high, "RUNNING", timeout=20)
