"""Issue 29, findings 2 and 8: a job's output cannot wedge its node or hold its GPU.

A real server and a real ``gpufleet agent`` (as root, jobs as an unprivileged account):
jobs that print NUL bytes (each 6 bytes as JSON: before the fix the agent's sync body
passed the server's 1 MiB limit, got 413 and was resent for ever, the node went
NotReady and its jobs ran twice), a job that prints 20 MB at once (its exit was
reported only after its whole log had shipped, its GPU held meanwhile), a 1 TB sparse
log, and the per-job cap's marker line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobaccounts import PYTHON, ROOT, passable, user_map_file
from server.conftest import Server, make_pool, make_team, make_user, ok, unique, wait_for

pytestmark = pytest.mark.skipif(not ROOT, reason="a root agent runs jobs as another account")


class Node:
    def __init__(self, server: Server, tmp_path: Path, *extra: str, gpus: int = 2) -> None:
        self.name, self.pool = unique("logs"), make_pool(server)
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
        args += ["--address", "127.0.0.1", "--cgroup-root", "/sys/fs/cgroup/gpufleet-test", *extra]
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
def node(server: Server, tmp_path: Path) -> Iterator[Node]:
    n = Node(server, tmp_path)
    yield n
    n.close()


def submit(server: Server, node: Node, token: str, team: str, script: str, gpus: int = 1) -> int:
    with server.client(token) as c:
        spec = {"command": ["sh", "-c", script], "pool": node.pool, "team": team, "gpus": gpus}
        return int(ok(c.post("/jobs", json=spec), 201)["id"])


def log_of(server: Server, job_id: int, *, follow: bool = False, timeout: float = 30) -> str:
    with server.client() as c:
        params = {"follow": "true"} if follow else {}
        return c.get(f"/jobs/{job_id}/logs", params=params, timeout=timeout).text


def test_nul_output_never_wedges_the_node_nor_runs_a_job_twice(server: Server, tmp_path: Path) -> None:
    node = Node(server, tmp_path, gpus=4)  # the three run at once: their chunks share one sync
    try:
        _nul_scenario(server, node)
    finally:
        node.close()


def _nul_scenario(server: Server, node: Node) -> None:
    team = make_team(server)
    token = make_user(server, team=team)
    nul = "head -c 300000 /dev/zero; sleep 1"
    attackers = [submit(server, node, token, team, nul) for _ in range(3)]
    victim = submit(server, node, token, team, "echo victim-ran; sleep 2")
    for job in [*attackers, victim]:
        done = wait_for(server, job, "COMPLETED", timeout=60)
        assert done["attempts"] == 0, done  # ran once, never requeued
    with server.client() as c:
        assert ok(c.get(f"/nodes/{node.name}"))["state"] == "Ready"
    assert log_of(server, victim, follow=True).count("victim-ran") == 1
    text = log_of(server, attackers[0], follow=True, timeout=60)
    assert text.count("\u2400") == 300_000  # every NUL arrived (stored as the symbol for NUL)


def test_a_job_that_prints_20_mb_ends_at_once_and_frees_its_gpu(server: Server, node: Node) -> None:
    team = make_team(server)
    token = make_user(server, team=team)
    loud = submit(server, node, token, team, "head -c 15000000 /dev/zero | base64 -w 100", gpus=2)
    t0 = time.monotonic()
    wait_for(server, loud, "COMPLETED", timeout=20)
    assert time.monotonic() - t0 < 15
    after = submit(server, node, token, team, "echo next", gpus=2)  # the same two GPUs
    wait_for(server, after, "COMPLETED", timeout=20)
    assert log_of(server, loud).startswith("AAAA")  # the log follows at its own pace


def test_a_sparse_terabyte_log_costs_little_and_the_job_ends(server: Server, node: Node) -> None:
    team = make_team(server)
    token = make_user(server, team=team)
    grow = f"echo before; {PYTHON} -c 'import os; os.ftruncate(1, 10**12)'; echo after"
    job = submit(server, node, token, team, grow)
    wait_for(server, job, "COMPLETED", timeout=20)
    text = log_of(server, job, follow=True)
    assert text.startswith("before\n") and "hole in the log" in text and len(text) < 65536
    endless = submit(
        server, node, token, team, f"{PYTHON} -c 'import os; os.ftruncate(1, 10**12)'; sleep 300"
    )
    wait_for(server, endless, "RUNNING", timeout=20)
    with server.client() as c:
        ok(c.post(f"/jobs/{endless}/cancel"))
    wait_for(server, endless, "CANCELLED", timeout=20)
    assert len(log_of(server, endless, follow=True)) < 65536


def test_the_per_job_log_cap_says_so_once(server: Server, tmp_path: Path) -> None:
    capped = Node(server, tmp_path, "--job-log-max", "100K")
    try:
        team = make_team(server)
        token = make_user(server, team=team)
        job = submit(server, capped, token, team, "for i in $(seq 1 20000); do echo line-$i; done; sleep 1")
        wait_for(server, job, "COMPLETED", timeout=30)
        text = log_of(server, job, follow=True)
        assert text.count("reached its cap") == 1
        assert 100_000 <= len(text) < 100_000 + 300_000 and "line-20000" not in text
    finally:
        capped.close()
