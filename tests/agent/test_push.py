"""Push dispatch end to end (``server/store/dispatch.py``, ``Agent.start_watch``): an agent
whose periodic sync is a minute away starts a new job within a second because its
long-poll is answered; a long-poll that times out; one answered at once for a version
from another boot; a lost wake-up recovered by the periodic sync; waiting agents across
a server restart; who may wait; and that waiting holds no lane seat."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent import Agent, AgentConfig, HttpTransport, SimSpec, SimulatedProbe, make_agent
from jobaccounts import PYTHON, passable, run_as
from server.conftest import (
    ADMIN_TOKEN,
    Server,
    free_port,
    make_pool,
    make_team,
    make_user,
    ok,
    unique,
)

QUICK = [PYTHON, "-c", "pass"]


def join_token(url: str, node: str) -> str:
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        return str(ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"])


def agent_for(url: str, work: Path, *, pool: str, transport: Any = None, sync_s: float = 60.0) -> Agent:
    node = unique("push")
    passable(work)
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": []}))
    config = AgentConfig(
        node=node, work_dir=work / node, address="127.0.0.1", grace_s=1.0, sync_interval_s=sync_s, wait_s=5.0
    )
    transport = transport or HttpTransport(url, join_token(url, node))
    return make_agent(
        config=config,
        probe=SimulatedProbe(node=node, spec=SimSpec(gpus=2)),
        transport=transport,
        run_as=run_as(),
    )


class Running:
    """An agent's real loop (``Agent.run``) in a thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stop = threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> Agent:
        self.thread.start()
        # the set-up, not the promise under test: registered, and the first long-poll
        # answered (its push may fold into the registration when it answers first: then no
        # second sync comes, and none is needed); a failed long-poll retries in 1, 2, 4 s
        deadline = time.monotonic() + 30
        bell = self.agent.doorbell
        while (
            self.agent.stats.syncs < 1
            or bell.answers < 1
            or (self.agent._pushed and self.agent.stats.syncs < 2)
        ):
            assert time.monotonic() < deadline, (self.agent.stats, bell.answers)
            time.sleep(0.02)
        return self.agent

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.agent.stop_all(timeout_s=2)
        self.agent.close()


def submit(url: str, *, pool: str, team: str, command: list[str], **spec: Any) -> int:
    body = {"command": command, "pool": pool, "team": team, "gpus": 1, **spec}
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        return int(ok(c.post("/jobs", json=body), 201)["id"])


def until_state(url: str, job_id: int, state: str, timeout: float) -> float:
    t0 = time.monotonic()
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        while True:
            got = ok(c.get(f"/jobs/{job_id}"))["state"]
            if got == state:
                return time.monotonic() - t0
            assert time.monotonic() - t0 < timeout, f"job {job_id} still {got} after {timeout}s"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def test_a_waiting_agent_starts_its_new_job_at_once(server: Server, team: str, tmp_path: Path) -> None:
    """The periodic sync is a minute away: only the push can explain a start in seconds;
    the exit is reported as fast (the process's pidfd kicks the agent)."""
    pool = make_pool(server)
    with Running(agent_for(server.url, tmp_path, pool=pool)) as agent:
        syncs = agent.stats.syncs
        jid = submit(server.url, pool=pool, team=team, command=QUICK)
        took = until_state(server.url, jid, "COMPLETED", timeout=10)
        assert took < 5.0
        assert agent.stats.syncs - syncs <= 6  # woken, started (+ running), exited: not a poll loop
    with server.client() as c:
        text = c.get(server.url + "/metrics").text
    rings = [line for line in text.splitlines() if line.startswith("gpufleet_dispatch_rings_total ")]
    assert rings and float(rings[0].split()[1]) >= 1
    assert "gpufleet_agents_waiting " in text


def test_a_cancel_reaches_the_running_job_at_once(server: Server, team: str, tmp_path: Path) -> None:
    pool = make_pool(server)
    with Running(agent_for(server.url, tmp_path, pool=pool)) as agent:
        jid = submit(server.url, pool=pool, team=team, command=[PYTHON, "-c", "import time; time.sleep(60)"])
        until_state(server.url, jid, "RUNNING", timeout=10)
        with server.client() as c:
            ok(c.post(f"/jobs/{jid}/cancel"))
        deadline = time.monotonic() + 5
        while agent.running():
            assert time.monotonic() < deadline, "the stop did not reach the agent"
            time.sleep(0.02)


def test_a_long_poll_times_out_with_the_same_version(server: Server) -> None:
    node = unique("waiter")
    with server.client() as c:
        first = ok(c.get(f"/nodes/{node}/wait", params={"timeout": 0}))["version"]
        t0 = time.monotonic()
        again = ok(c.get(f"/nodes/{node}/wait", params={"seen": first, "timeout": 0.5}))["version"]
        assert again == first and time.monotonic() - t0 >= 0.45
        t0 = time.monotonic()  # a version of another boot (a restarted server): at once
        other = ok(c.get(f"/nodes/{node}/wait", params={"seen": "0ld.7", "timeout": 5}))["version"]
        assert other == first and time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("timeout", ["-1", "61", "nan", "inf", "soon"])
def test_a_bad_timeout_is_a_422(server: Server, timeout: str) -> None:
    with server.client() as c:
        resp = c.get(f"/nodes/{unique('n')}/wait", params={"timeout": timeout})
    assert resp.status_code == 422 and resp.headers["content-type"].startswith("application/problem+json")


def test_only_who_may_sync_a_node_may_wait_on_it(server: Server, team: str) -> None:
    mine, other = unique("mine"), unique("other")
    user = make_user(server, team=team)
    cred = join_token(server.url, mine)
    with server.client(cred) as c:
        assert c.get(f"/nodes/{mine}/wait", params={"timeout": 0}).status_code == 200
        resp = c.get(f"/nodes/{other}/wait", params={"timeout": 0})
        assert resp.status_code == 403 and mine in resp.json()["detail"]
    with server.client(user) as c:
        assert c.get(f"/nodes/{mine}/wait", params={"timeout": 0}).status_code == 403
    with server.client(None) as c:
        assert c.get(f"/nodes/{mine}/wait", params={"timeout": 0}).status_code == 401


def test_waiting_agents_hold_no_lane_seat(server: Server) -> None:
    """More long-polls than the node lane has seats (16), and a sync still goes through."""
    node = unique("seats")
    with server.client() as c:
        seen = ok(c.get(f"/nodes/{node}/wait", params={"timeout": 0}))["version"]

    def wait() -> None:
        with server.client() as c:
            c.get(f"/nodes/{node}/wait", params={"seen": seen, "timeout": 3})

    waiters = [threading.Thread(target=wait) for _ in range(24)]
    for t in waiters:
        t.start()
    time.sleep(0.5)
    try:
        with server.client() as c:
            t0 = time.monotonic()
            body = {"gpus": [{"index": 0, "uuid": f"GPU-{node}", "model": "H100"}]}
            ok(c.post(f"/nodes/{node}/sync", json=body))
            assert time.monotonic() - t0 < 1.0
    finally:
        for t in waiters:
            t.join()


class Deaf:
    """A transport whose long-poll never reports a change (a lost wake-up, every time)."""

    def __init__(self, inner: HttpTransport) -> None:
        self.inner = inner

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.inner.sync(node, body)

    def wait(self, node: str, seen: str | None, timeout_s: float) -> str:
        time.sleep(min(timeout_s, 0.2))
        return "deaf"

    def close(self) -> None:
        self.inner.close()


def test_a_lost_wake_up_is_recovered_by_the_periodic_sync(server: Server, team: str, tmp_path: Path) -> None:
    pool = make_pool(server)
    node_agent = agent_for(server.url, tmp_path, pool=pool, sync_s=1.0)
    node_agent.transport = Deaf(node_agent.transport)  # type: ignore[arg-type]
    with Running(node_agent):
        jid = submit(server.url, pool=pool, team=team, command=QUICK)
        assert until_state(server.url, jid, "COMPLETED", timeout=10) < 6


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A server on a fixed port that the test may restart (SQLite file kept)."""
    port = free_port()
    db_url = f"sqlite:///{tmp_path / 'restart.db'}"
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db_url],
            env={**os.environ, "GPUFLEET_ADMIN_TOKEN": ADMIN_TOKEN},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)

    def restart() -> None:
        procs[-1].terminate()
        procs[-1].wait(15)  # shutdown answers the waiting long-polls: it does not wait them out
        start()

    start()
    yield f"http://127.0.0.1:{port}", restart
    for p in procs:
        p.kill()
        p.wait()


def test_waiting_agents_carry_on_after_a_server_restart(own_server: tuple[str, Any], tmp_path: Path) -> None:
    url, restart = own_server
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        team = unique("team")
        ok(c.post("/teams", json={"name": team}), 201)
        ok(c.post(f"/teams/{team}/members", json={"user": "admin"}))
        pool = unique("pool")
        ok(c.post("/pools", json={"name": pool, "gpu": True}), 201)
    with Running(agent_for(url, tmp_path, pool=pool)) as agent:
        t0 = time.monotonic()
        restart()
        assert time.monotonic() - t0 < 15
        deadline = time.monotonic() + 15
        synced = agent.stats.syncs
        while agent.stats.syncs <= synced or agent.stats.last_error is not None:  # back, re-synced
            assert time.monotonic() < deadline, agent.stats
            time.sleep(0.05)
        time.sleep(0.5)
        jid = submit(url, pool=pool, team=team, command=QUICK)
        assert until_state(url, jid, "COMPLETED", timeout=15) < 8


def test_cpus_reported_by_the_agent_limit_what_runs_beside_each_other(
    server: Server, team: str, tmp_path: Path
) -> None:
    """The agent reports 16 CPUs (``SimSpec.cpus``); the scheduler fits jobs' CPU
    requests next to their GPUs: the second 10-CPU job waits with a Resources reason
    though a GPU is free, a 17-CPU job can never run there."""
    pool = make_pool(server)
    bot = agent_for(server.url, tmp_path, pool=pool)
    bot.probe = SimulatedProbe(node=bot.config.node, spec=SimSpec(gpus=2, cpus=16))
    bot.inventory = bot.probe.inventory()
    with Running(bot), server.client() as c:
        node = ok(c.get(f"/nodes/{bot.config.node}"))
        sleeper = [PYTHON, "-c", "import time; time.sleep(30)"]
        first = submit(server.url, pool=pool, team=team, command=sleeper, cpus_per_task=10)
        second = submit(server.url, pool=pool, team=team, command=sleeper, cpus_per_task=10)
        never = ok(
            c.post("/jobs", json={"command": QUICK, "pool": pool, "team": team, "cpus_per_task": 17}), 201
        )
        until_state(server.url, first, "RUNNING", timeout=10)
        deadline = time.monotonic() + 10
        while True:
            two, big = ok(c.get(f"/jobs/{second}")), ok(c.get(f"/jobs/{never['id']}"))
            if (two["wait_reason"] or "").startswith("Resources") and (big["wait_reason"] or "").startswith(
                "Unschedulable"
            ):
                break
            assert time.monotonic() < deadline, (two, big)
            time.sleep(0.05)
        assert "10 CPUs" in two["wait_reason"] and "17 CPUs" in big["wait_reason"]
        for jid in (first, second, never["id"]):
            c.post(f"/jobs/{jid}/cancel")
    assert node["cpus"] == 16 and node["memory_mb"] > 0
