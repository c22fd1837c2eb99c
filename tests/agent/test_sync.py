"""Agents against a real server: registration and telemetry, real jobs end to end with
logs, idempotency (duplicate sync, lost reply, agent restart re-adopting a running job),
stops on cancel, node credentials that speak only for their node, multi-node specs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.fake_nvml import FakeGpu, FakeNvml
from gpufleet.agent import (
    Agent,
    AgentConfig,
    AgentTransportError,
    HttpTransport,
    NvmlProbe,
    SimSpec,
    SimulatedProbe,
    make_agent,
)
from jobaccounts import passable, run_as
from server.conftest import ADMIN_TOKEN, Server, make_pool, make_team, make_user, ok, unique, wait_for

PY = "python3"
MARKER = "import os, time; open(os.environ['GPUFLEET_CHECKPOINT_DIR'] + '/starts', 'a').write('x'); "


class Flaky:
    """A transport double around the real one: ``duplicate`` sends every message twice;
    ``lose_next`` delivers the next message but loses its reply."""

    def __init__(self, inner: HttpTransport) -> None:
        self.inner = inner
        self.duplicate = False
        self.lose_next = 0
        self.sent = 0

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = self.inner.sync(node, body)
        self.sent += 1
        if self.duplicate:
            reply = self.inner.sync(node, body)
        if self.lose_next:
            self.lose_next -= 1
            raise AgentTransportError("reply lost (test)")
        return reply

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def join_token(server: Server, node: str | None = None) -> str:
    with server.client() as c:
        return str(ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"])


def new_agent(
    server: Server, work: Path, *, pool: str, node: str | None = None, token: str | None = None, gpus: int = 2
) -> tuple[Agent, Flaky]:
    node = node or unique("agent")
    passable(work)  # jobs run as an unprivileged account: it must reach its directories
    with server.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": []}))
    transport = Flaky(HttpTransport(server.url, token or join_token(server, node)))
    config = AgentConfig(node=node, work_dir=work / node, address="127.0.0.1", grace_s=1.0, news_gap_s=0.0)
    probe = SimulatedProbe(node=node, spec=SimSpec(gpus=gpus))
    return make_agent(config=config, probe=probe, transport=transport, run_as=run_as()), transport


def drive(agent: Agent, until: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "condition not reached"
        agent.tick()
        agent.sync_once()
        time.sleep(0.05)


def job_log(server: Server, job_id: int) -> str:
    with server.client() as c:
        return c.get(f"/jobs/{job_id}/logs").text


def job_state(server: Server, job_id: int) -> str:
    with server.client() as c:
        return str(ok(c.get(f"/jobs/{job_id}"))["state"])


def submit(
    server: Server, *, pool: str, team: str, command: list[str], token: str = ADMIN_TOKEN, **kw: Any
) -> int:
    with server.client(token) as c:
        body = {"command": command, "pool": pool, "team": team, "gpus": 1, **kw}
        return int(ok(c.post("/jobs", json=body), 201)["id"])


def test_agent_registers_its_gpus_and_telemetry(server: Server, tmp_path: Path) -> None:
    pool = make_pool(server)
    agent, _ = new_agent(server, tmp_path, pool=pool, gpus=4)
    assert agent.sync_once()
    with server.client() as c:
        node = ok(c.get(f"/nodes/{agent.config.node}"))
    assert node["state"] == "Ready" and node["gpus_total"] == 4 and node["pool"] == pool
    assert node["address"] == "127.0.0.1" and node["cuda_version"] == "12.4"
    tel = node["gpus"][0]["telemetry"]
    assert (
        tel["temperature_c"] is not None and tel["power_w"] is not None and tel["nvlink_peers"] == [1, 2, 3]
    )
    assert isinstance(agent.probe, SimulatedProbe)
    agent.probe.xid(3, 79)
    agent.sync_once()
    with server.client() as c:
        gpus = ok(c.get(f"/nodes/{agent.config.node}"))["gpus"]
    assert [g["healthy"] for g in gpus] == [True, True, True, False]
    assert gpus[3]["telemetry"]["health"] == ["xid 79"]


def test_nvml_retired_pages_over_the_limit_cordon_that_gpu(server: Server, tmp_path: Path) -> None:
    """NVML's retired pages (both causes) through the agent's sync to the server's
    ``retired_pages`` rule (default limit 60): that GPU is cordoned, its neighbour is not."""
    node = unique("nvml")
    with server.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": make_pool(server), "gpus": []}))
    gpus = [FakeGpu(uuid=f"GPU-{i}", bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(2)]
    gpus[1].retired_sbe = 10
    config = AgentConfig(node=node, work_dir=tmp_path / node, address="127.0.0.1", news_gap_s=0.0)
    transport = HttpTransport(server.url, join_token(server, node))
    agent = make_agent(
        config=config, probe=NvmlProbe(nvml=FakeNvml(gpus)), transport=transport, run_as=run_as()
    )
    try:
        assert agent.sync_once()
        with server.client() as c:
            out = ok(c.get(f"/nodes/{node}"))["gpus"]
        assert [g["telemetry"]["retired_pages"] for g in out] == [0, 10]
        gpus[1].retired_dbe = 50
        assert agent.sync_once()
        deadline = time.monotonic() + 10
        while True:
            with server.client() as c:
                out = ok(c.get(f"/nodes/{node}"))["gpus"]
            if out[1]["cordoned"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [g["cordoned"] for g in out] == [False, True]
        assert out[1]["cordon_reason"] == "60 retired pages"
    finally:
        agent.close()


def test_real_job_runs_with_logs_and_ownership(server: Server, team: str, tmp_path: Path) -> None:
    pool = make_pool(server)
    agent, _ = new_agent(server, tmp_path, pool=pool)
    agent.sync_once()
    owner = make_user(server, team=team)
    other = make_user(server, team=team)
    script = "import os; e = os.environ; print('hello from', e['GPUFLEET_JOB_ID'], 'gpus', "
    script += "e['CUDA_VISIBLE_DEVICES'])"
    jid = submit(server, pool=pool, team=team, command=[PY, "-c", script], token=owner)
    drive(agent, lambda: job_state(server, jid) == "COMPLETED")
    with server.client(owner) as c:
        text = c.get(f"/jobs/{jid}/logs").text
        followed = c.get(f"/jobs/{jid}/logs", params={"follow": "true"}).text  # ends: the job is over
    assert text == followed == f"hello from {jid} gpus 0\n"
    with server.client(other) as c:
        assert c.get(f"/jobs/{jid}/logs").status_code == 404
    drive(agent, lambda: not agent.jobs)  # reported and forgotten


def test_a_job_shorter_than_the_accrual_tick_gets_its_energy(
    server: Server, team: str, tmp_path: Path
) -> None:
    """The exit sync closes the job's accrual with the node's latest power readings
    (the accounting loop's 15 s tick never sees a 1-second job)."""
    pool = make_pool(server)
    agent, _ = new_agent(server, tmp_path, pool=pool)
    agent.sync_once()
    jid = submit(server, pool=pool, team=team, command=[PY, "-c", "import time; time.sleep(1)"])
    drive(agent, lambda: job_state(server, jid) == "COMPLETED")
    with server.client() as c:
        job = ok(c.get(f"/jobs/{jid}"))
    # 1 GPU for about a second at the simulated GPU's power (tens to hundreds of watts)
    assert 0 < job["energy_kwh"] < 0.001


def test_duplicate_and_lost_messages_start_a_job_once(server: Server, team: str, tmp_path: Path) -> None:
    pool = make_pool(server)
    agent, transport = new_agent(server, tmp_path, pool=pool)
    agent.sync_once()
    transport.duplicate = True
    marker = MARKER + "time.sleep(1)"
    jid = submit(server, pool=pool, team=team, command=[PY, "-c", marker])
    wait_for(server, jid, "SCHEDULED")
    transport.lose_next = 2  # the reply that says "start it" is lost, and the next one too
    for _ in range(3):
        agent.sync_once()
    drive(agent, lambda: job_state(server, jid) == "COMPLETED")
    starts = (agent.store.checkpoint_dir(jid) / "starts").read_text()
    assert starts == "x"
    assert agent.stats.started == 1


def test_restarted_agent_readopts_its_running_job(server: Server, team: str, tmp_path: Path) -> None:
    pool = make_pool(server)
    first, _ = new_agent(server, tmp_path, pool=pool)
    first.sync_once()
    marker = MARKER + "time.sleep(2)"
    jid = submit(server, pool=pool, team=team, command=[PY, "-c", marker])
    drive(first, lambda: job_state(server, jid) == "RUNNING")
    node = first.config.node
    # The agent dies (no stop, no goodbye); a new one starts on the same work dir.
    second, _ = new_agent(server, tmp_path, pool=pool, node=node, token=join_token(server, node))
    assert second.restore() == 1
    assert second.running() and second.running()[0].job_id == jid
    drive(second, lambda: job_state(server, jid) == "COMPLETED")
    assert (second.store.checkpoint_dir(jid) / "starts").read_text() == "x"
    assert second.stats.started == 0


def test_cancel_stops_the_process_and_confirms(server: Server, team: str, tmp_path: Path) -> None:
    pool = make_pool(server)
    agent, _ = new_agent(server, tmp_path, pool=pool)
    agent.sync_once()
    jid = submit(
        server,
        pool=pool,
        team=team,
        command=[PY, "-c", "import time; print('up', flush=True); time.sleep(60)"],
    )
    drive(agent, lambda: job_state(server, jid) == "RUNNING" and "up" in job_log(server, jid))
    with server.client() as c:
        ok(c.post(f"/jobs/{jid}/cancel"))
    drive(agent, lambda: not agent.jobs)
    assert agent.stats.stopped == 1
    with server.client() as c:
        assert "up\n" in c.get(f"/jobs/{jid}/logs").text
    # The node confirmed the stop: the job is no longer waiting on it anywhere.
    with server.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT stopping_on FROM jobs WHERE id = :i"), {"i": jid}).scalar() is None


@pytest.mark.parametrize(
    ("bound_to", "speaks_for", "status"),
    [
        ("self", "self", 200),
        ("self", "other", 403),
        (None, "self", 200),
    ],
    ids=["own-node", "another-node", "unbound-binds-on-first-use"],
)
def test_node_credential_speaks_only_for_its_node(
    server: Server, bound_to: str | None, speaks_for: str, status: int
) -> None:
    me, other = unique("cred"), unique("cred")
    token = join_token(server, me if bound_to == "self" else None)
    target = me if speaks_for == "self" else other
    body = {"gpus": [{"index": 0, "model": "H100"}], "jobs": []}
    with httpx.Client(base_url=server.url + "/v1", headers={"Authorization": f"Bearer {token}"}) as c:
        assert c.post(f"/nodes/{target}/sync", json=body).status_code == status
        # Once bound (at creation or first use) it cannot speak for any other node.
        assert c.post(f"/nodes/{unique('cred')}/sync", json=body).status_code == 403


@pytest.mark.parametrize(
    ("token", "status"),
    [("gfn_not-a-real-one", 401), ("user", 403)],
    ids=["unknown-node-credential", "plain-user"],
)
def test_sync_refuses_bad_credentials(server: Server, team: str, token: str, status: int) -> None:
    secret = make_user(server, team=team) if token == "user" else token
    with httpx.Client(base_url=server.url + "/v1", headers={"Authorization": f"Bearer {secret}"}) as c:
        assert c.post(f"/nodes/{unique('x')}/sync", json={"jobs": []}).status_code == status


def test_only_operators_create_join_tokens(server: Server, team: str) -> None:
    with server.client(make_user(server, team=team)) as c:
        assert c.post("/nodes/join-tokens", json={}).status_code == 403


def test_multi_node_job_gets_torchrun_variables(server: Server, team: str) -> None:
    pool = make_pool(server)
    nodes = [unique("mn") for _ in range(2)]
    with server.client() as c:
        for i, n in enumerate(nodes):
            body = {
                "gpus": [{"index": 0, "model": "H100"}, {"index": 1, "model": "H100"}],
                "address": f"10.0.0.{i + 1}",
            }
            ok(c.put(f"/nodes/{n}", json={"pool": pool, "gpus": body["gpus"]}))
            ok(c.post(f"/nodes/{n}/sync", json=body))
    jid = submit(server, pool=pool, team=team, command=["torchrun", "train.py"], gpus=4, gpus_per_node=2)
    wait_for(server, jid, "SCHEDULED")
    with server.client() as c:
        specs = [ok(c.post(f"/nodes/{n}/sync", json={"jobs": []}))["jobs"][0] for n in nodes]
    assert sorted(s["node_rank"] for s in specs) == [0, 1]
    master = next(s for s in specs if s["node_rank"] == 0)
    assert {s["master_addr"] for s in specs} == {master["nodes"][0]["address"]}
    assert {s["master_port"] for s in specs} == {20_000 + jid % 20_000}
    assert {s["world_size"] for s in specs} == {4}
    assert [p["address"] for p in specs[0]["nodes"]] == [p["address"] for p in specs[1]["nodes"]]
    with server.client() as c:
        ok(c.post(f"/jobs/{jid}/cancel"))


def test_fleet_summary_counts(server: Server) -> None:
    with server.client() as c:
        s = ok(c.get("/fleet/summary"))
    assert s["nodes"] >= s["nodes_ready"] >= 0 and s["sync"]["count"] >= 0
