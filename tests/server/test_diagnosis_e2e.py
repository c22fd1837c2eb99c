"""Issue 34, failure diagnosis, on a real server and a real ``gpufleet agent`` (as root,
jobs as an unprivileged account, simulated GPUs): a failed job's output is matched
against the known signatures and the finding is on the job (its JSON, ``gpufleet jobs
show``, an event); the same node-blaming signature in failed jobs of three users cordons
the node with the evidence; one user alone, or a job that succeeded, cordons nothing;
and nobody but the node that ran a job can make a node suspect."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from jobaccounts import ROOT, passable, user_map_file
from server.conftest import (
    Server,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    start_server,
    stop_server,
    unique,
    wait_for,
)

pytestmark = pytest.mark.skipif(not ROOT, reason="a root agent runs jobs as another account")

IB = (
    "ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
    "10.1.2.36<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv)"
)
XID79 = "NVRM: Xid (PCI:0000:44:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


class Agent:
    """One node with a real agent on simulated GPUs (jobs run as the test account)."""

    def __init__(self, server: Server, tmp_path: Path, gpus: int = 2) -> None:
        self.name, self.pool = unique("diag"), make_pool(server)
        with server.client() as c:
            ok(c.put(f"/nodes/{self.name}", json={"pool": self.pool, "gpus": []}))
            credential = ok(c.post("/nodes/join-tokens", json={"node": self.name}), 201)["token"]
        passable(tmp_path)
        token_file = tmp_path / "node.token"
        token_file.write_text(credential + "\n")
        token_file.chmod(0o600)
        args = ["agent", "--server", server.url, "--token-file", str(token_file), "--name", self.name]
        args += ["--simulate-gpus", str(gpus), "--work-dir", str(tmp_path / "work")]
        args += ["--user-map", str(user_map_file(tmp_path)), "--sync-interval", "1s", "--grace", "1s"]
        args += ["--address", "127.0.0.1", "--cgroup-root", "/sys/fs/cgroup/gpufleet-test"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        self.proc = subprocess.Popen([sys.executable, "-m", "gpufleet", *args], env=env)
        deadline = time.monotonic() + 30
        with server.client() as c:
            while ok(c.get(f"/nodes/{self.name}"))["gpus_total"] < gpus:
                assert self.proc.poll() is None and time.monotonic() < deadline, "the agent did not register"
                time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def agent(server: Server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Agent]:
    if not server.db_url.startswith("sqlite") and request.function.__name__ not in BOTH_DATABASES:
        pytest.skip("a real agent's flow is the same on both databases: once, on SQLite")
    a = Agent(server, tmp_path)
    yield a
    a.close()


BOTH_DATABASES = {"test_three_users_failing_with_an_xid_cordon_the_node_with_the_evidence"}
"""The suspicion's reads and writes run on PostgreSQL too; the other agent flows once."""


def run(server: Server, agent: Agent, token: str, team: str, script: str, state: str = "FAILED") -> int:
    with server.client(token) as c:
        spec = {"command": ["sh", "-c", script], "pool": agent.pool, "team": team, "gpus": 1}
        job = int(ok(c.post("/jobs", json=spec), 201)["id"])
    wait_for(server, job, state, timeout=30)
    return job


def diagnosed(server: Server, job: int, *, token: str | None = None, timeout: float = 20) -> dict[str, Any]:
    """The job's JSON once it carries a diagnosis (its log closes, then the loop reads it)."""
    deadline = time.monotonic() + timeout
    with server.client(token) if token else server.client() as c:
        while True:
            got = ok(c.get(f"/jobs/{job}"))
            if got.get("diagnosis") or time.monotonic() > deadline:
                assert got.get("diagnosis"), got
                return dict(got)
            time.sleep(0.2)


def events(server: Server, node: str) -> list[dict[str, Any]]:
    with server.client() as c:
        return list(ok(c.get("/fleet/events", params={"node": node, "limit": 1000})))


def settled(server: Server, job: int) -> None:
    """The job's log has closed and the diagnosis loop has looked at it."""
    deadline = time.monotonic() + 20
    with server.engine.connect() as conn:
        while True:
            row = conn.execute(
                text("SELECT done_at FROM job_diagnoses WHERE job_id = :j"), {"j": job}
            ).first()
            conn.rollback()
            if (row is not None and row[0] is not None) or time.monotonic() > deadline:
                assert row is not None and row[0] is not None, f"job {job} was never diagnosed"
                return
            time.sleep(0.2)


def test_a_job_that_prints_an_nccl_ib_error_and_exits_1_shows_the_diagnosis(
    server: Server, agent: Agent
) -> None:
    team = make_team(server)
    token = make_user(server, team=team)
    job = run(server, agent, token, team, f"echo step 10; echo {shlex.quote(IB)} >&2; echo traceback; exit 1")
    got = diagnosed(server, job, token=token)  # its owner sees it
    d = got["diagnosis"]
    assert (d["signature"], d["blame"], d["node"]) == ("nccl-ib-completion-error", "node", agent.name)
    assert "status=12" in d["line"] and "firmware" in d["hint"]
    assert any(e["actor"] == "diagnosis" and "nccl-ib-completion-error" in e["reason"] for e in got["events"])
    shown = gpufleet("jobs", "show", str(job), env=server.env(token))
    assert shown.returncode == 0, shown.stderr
    assert "nccl-ib-completion-error" in shown.stdout and "the node" in shown.stdout
    assert "NET/IB : Got completion" in shown.stdout
    suspects = [e for e in events(server, agent.name) if e["kind"] == "suspect"]
    assert [e["job_id"] for e in suspects] == [job]  # one user: suspect, not cordoned
    with server.client() as c:
        assert ok(c.get(f"/nodes/{agent.name}"))["cordoned"] is False


def test_a_job_that_succeeds_or_blames_its_own_code_makes_nobody_suspect(
    server: Server, agent: Agent
) -> None:
    team = make_team(server)
    token = make_user(server, team=team)
    fine = run(server, agent, token, team, f"echo {shlex.quote(XID79)}; exit 0", state="COMPLETED")
    oom = run(server, agent, token, team, "echo 'torch.cuda.OutOfMemoryError: CUDA out of memory.'; exit 1")
    assert diagnosed(server, oom)["diagnosis"]["signature"] == "cuda-oom"
    with server.client() as c:
        assert ok(c.get(f"/jobs/{fine}")).get("diagnosis") is None
    assert [e for e in events(server, agent.name) if e["kind"] == "suspect"] == []


def test_three_users_failing_with_an_xid_cordon_the_node_with_the_evidence(
    server: Server, agent: Agent
) -> None:
    team = make_team(server)
    alice, bob, carol = (make_user(server, team=team) for _ in range(3))
    script = f"echo loading; echo {shlex.quote(XID79)}; exit 1"
    first = run(server, agent, alice, team, script)
    again = run(server, agent, alice, team, script)  # one user twice: one voice
    second = run(server, agent, bob, team, script)
    for job in (first, again, second):
        assert diagnosed(server, job)["diagnosis"]["signature"] == "xid-79-fell-off-bus"
    with server.client() as c:
        assert ok(c.get(f"/nodes/{agent.name}"))["cordoned"] is False
    third = run(server, agent, carol, team, script)
    assert diagnosed(server, third)["diagnosis"]["blame"] == "node"
    with server.client() as c:
        node = ok(c.get(f"/nodes/{agent.name}"))
    assert node["cordoned"] is True and "xid-79-fell-off-bus" in node["cordon_reason"]
    cordons = [e for e in events(server, agent.name) if e["kind"] == "cordoned"]
    assert len(cordons) == 1 and cordons[0]["actor"] == "diagnosis" and cordons[0]["severity"] == "critical"
    for job in (first, again, second, third):
        assert str(job) in cordons[0]["reason"]
    assert "fallen off the bus" in cordons[0]["reason"]
    # an operator uncordons; the spent evidence does not cordon it again by itself
    with server.client() as c:
        ok(c.post(f"/nodes/{agent.name}/uncordon", json={}))
    fourth = run(server, agent, alice, team, script)
    diagnosed(server, fourth)
    with server.client() as c:
        assert ok(c.get(f"/nodes/{agent.name}"))["cordoned"] is False


def test_a_user_cannot_make_another_node_suspect(server: Server, agent: Agent) -> None:
    team = make_team(server)
    tokens = [make_user(server, team=team) for _ in range(3)]
    other = make_node(server, pool=agent.pool, gpus=0)  # no agent: nothing runs there
    # the diagnosis comes from the job's own output on its own node, whatever it names
    script = f"echo {shlex.quote(f'node {other}: {XID79}')}; exit 1"
    jobs = [run(server, agent, t, team, script) for t in tokens]
    for job in jobs:
        settled(server, job)
        assert diagnosed(server, job)["diagnosis"]["node"] == agent.name
    with server.client() as c:
        assert ok(c.get(f"/nodes/{other}"))["cordoned"] is False
    assert events(server, other) == []
    # and a user cannot speak for a node: its sync is refused, nothing is queued
    forged = {
        "gpus": [],
        "jobs": [{"job_id": jobs[0], "attempt": 1, "state": "exited", "exit_code": 1}],
        "logs": [{"job_id": jobs[0], "attempt": 1, "offset": 0, "end": 10, "data": XID79, "last": True}],
    }
    with server.client(tokens[0]) as c:
        assert c.post(f"/nodes/{other}/sync", json=forged).status_code in (401, 403)
    with server.engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM job_diagnoses WHERE node = :n"), {"n": other}).scalar()
    assert rows == 0


RULES = """
[[signature]]
id = "nccl-socket-timeout"
pattern = 'NCCL WARN .*socket timed out'
diagnosis = "an NCCL socket connection timed out"
hint = "check the node's Ethernet link and NCCL_SOCKET_IFNAME"
blame = "unknown"
priority = 60

[[signature]]
id = "greedy"
pattern = '(a+)+b'
diagnosis = "refused: it backtracks"
"""


def test_operators_signatures_from_a_toml_file(tmp_path: Path) -> None:
    """``--diagnosis-rules``: a bad entry is skipped with a warning, the server starts and
    the good one diagnoses; a file that is no TOML refuses to start, saying why."""
    broken = tmp_path / "broken.toml"
    broken.write_text("[[signature]\n")
    refused = gpufleet(
        "server",
        "--port",
        "1",
        "--database-url",
        f"sqlite:///{tmp_path / 'x.db'}",
        "--diagnosis-rules",
        str(broken),
    )
    assert refused.returncode != 0 and "--diagnosis-rules: not TOML" in refused.stderr
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    srv = start_server(f"sqlite:///{tmp_path / 'rules.db'}", extra=("--diagnosis-rules", str(rules)))
    agent = None
    try:
        assert "signature 2 ('greedy'): pattern may backtrack without end" in srv.stderr()
        assert "1 of 2 signatures skipped" in srv.stderr()
        (tmp_path / "agent").mkdir()
        agent = Agent(srv, tmp_path / "agent")
        team = make_team(srv)
        token = make_user(srv, team=team)
        line = "h:1:2 [0] NCCL WARN Call to connect returned Connection refused, socket timed out"
        job = run(srv, agent, token, team, f"echo {shlex.quote(line)}; exit 3")
        d = diagnosed(srv, job)["diagnosis"]
        assert (d["signature"], d["blame"]) == ("nccl-socket-timeout", "unknown")
        assert "NCCL_SOCKET_IFNAME" in d["hint"]
    finally:
        if agent is not None:
            agent.close()
        stop_server(srv)
