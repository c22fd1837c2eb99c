"""Issue 29, finding 5, end to end: a job is all its processes. A real server and a real
root agent (its jobs in cgroups where the machine has them): a job that leaves a
``setsid`` process and a double-forked daemon behind, cancelled or ending by itself.
When the server learns the end (the job COMPLETED; the cancelled job's GPUs given to the
next job), nothing of it runs any more. Before the fix the leftovers kept running with
the job's ``CUDA_VISIBLE_DEVICES`` while their GPU went to the next job."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from jobaccounts import ROOT
from server.conftest import Server, make_team, make_user, ok, wait_for
from server.test_hardening_node_logs import Node, submit

pytestmark = pytest.mark.skipif(not ROOT, reason="a root agent runs jobs as another account")
LEAVE_BEHIND = "setsid sh -c 'exec sleep 300' & sh -c 'sleep 301 & exit 0' & sleep 0.3; echo started; "


def _of(job_id: int, node: str) -> set[int]:
    """Processes that carry the job's mark (its id and node in their environment)."""
    found = set()
    for p in psutil.process_iter():
        try:
            env = p.environ()
        except psutil.Error:
            continue
        if env.get("GPUFLEET_JOB_ID") == str(job_id) and env.get("GPUFLEET_NODE") == node:
            found.add(p.pid)
    return found


def _wait(cond: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_nothing_of_a_job_outlives_it(server: Server, tmp_path: Path) -> None:
    node = Node(server, tmp_path, gpus=1)
    try:
        team = make_team(server)
        token = make_user(server, team=team)
        done = submit(server, node, token, team, LEAVE_BEHIND + "exit 0")
        wait_for(server, done, "COMPLETED", timeout=20)
        assert _of(done, node.name) == set()  # its end was reported once they were gone
        cancelled = submit(server, node, token, team, LEAVE_BEHIND + "sleep 300")
        wait_for(server, cancelled, "RUNNING", timeout=20)
        _wait(lambda: len(_of(cancelled, node.name)) >= 3)
        with server.client() as c:
            ok(c.post(f"/jobs/{cancelled}/cancel"))
        nxt = submit(server, node, token, team, "echo next")  # the same GPU, once it is free
        wait_for(server, nxt, "COMPLETED", timeout=20)
        assert _of(cancelled, node.name) == set()
    finally:
        node.close()
