"""A real server with short failover timings (node timeout 1 s, lost 2 s later, a GPU
too hot for 0.5 s, recovered after 1.5 s) and in-process agents with simulated GPUs
whose faults the tests inject. SQLite, and PostgreSQL (a database of its own, so the
session server of ``tests/server`` keeps its tables) when GPUFLEET_TEST_DATABASE_URL is
set."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import Agent, AgentConfig, HttpTransport, SimSpec, SimulatedProbe, make_agent
from jobaccounts import passable, run_as
from server.conftest import Server, make_team, ok, scratch_postgres, start_server, stop_server, unique

NODE_TIMEOUT_S = 1.0
REQUEUE_AFTER_S = 2.0
FAST = (
    "--node-timeout", str(NODE_TIMEOUT_S), "--requeue-after", str(REQUEUE_AFTER_S),
    "--gpu-hot-for", "0.5s", "--gpu-recover-after", "1.5s",
)  # fmt: skip


@pytest.fixture(scope="package", params=["sqlite", "postgresql"])
def fast_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            db_url = f"sqlite:///{tmp_path_factory.mktemp('failover') / 'gpufleet.db'}"
        else:
            db_url = stack.enter_context(scratch_postgres("failover"))  # runs side by side stay apart
        srv = start_server(db_url, extra=FAST)
        yield srv
        stop_server(srv)


@pytest.fixture(scope="package")
def team(fast_server: Server) -> str:
    return make_team(fast_server)


@dataclass
class Node:
    """An agent on its own thread; ``pause``/``resume`` stop and restart its loop (like
    SIGSTOP/SIGCONT: its jobs stay)."""

    name: str
    agent: Agent
    probe: SimulatedProbe
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def resume(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.agent.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def pause(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def close(self) -> None:
        self.pause()
        self.agent.stop_all(timeout_s=0.5)
        self.agent.close()


@pytest.fixture
def nodes(fast_server: Server, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(*, pool: str, gpus: int = 2) -> Node:
        name = unique("fnode")
        passable(tmp_path)  # jobs run as an unprivileged account: it must reach its directories
        with fast_server.client() as c:
            ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": []}))
            token = ok(c.post("/nodes/join-tokens", json={"node": name}), 201)["token"]
        config = AgentConfig(
            node=name,
            work_dir=tmp_path / name,
            address="127.0.0.1",
            sync_interval_s=0.25,
            news_gap_s=0.0,
            tick_s=0.05,
            grace_s=0.5,
            health_interval_s=0.1,
        )
        probe = SimulatedProbe(node=name, spec=SimSpec(gpus=gpus))
        agent = make_agent(
            config=config, probe=probe, transport=HttpTransport(fast_server.url, token), run_as=run_as()
        )
        node = Node(name=name, agent=agent, probe=probe)
        node.agent.sync_once()
        node.resume()
        made.append(node)
        return node

    yield make
    for n in made:
        n.close()


def make_pool(srv: Server) -> str:
    name = unique("fpool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": name}), 201)
    return name


def submit(srv: Server, *, team: str, pool: str, seconds: float = 60.0, **spec: Any) -> int:
    body = {
        "command": ["sim"],
        "gpus": 1,
        "team": team,
        "pool": pool,
        "env": {"GPUFLEET_SIMULATE_S": str(seconds)},
    }
    with srv.client() as c:
        return int(ok(c.post("/jobs", json=body | spec), 201)["id"])


def job(srv: Server, job_id: int) -> dict[str, Any]:
    with srv.client() as c:
        return ok(c.get(f"/jobs/{job_id}"))  # type: ignore[no-any-return]


def node_out(srv: Server, name: str) -> dict[str, Any]:
    with srv.client() as c:
        return ok(c.get(f"/nodes/{name}"))  # type: ignore[no-any-return]


def until(cond: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        time.sleep(0.05)


def running_on(srv: Server, job_id: int) -> tuple[str, list[int]] | None:
    j = job(srv, job_id)
    if j["state"] != "RUNNING" or not j["allocation"]:
        return None
    a = j["allocation"][0]
    return a["node"], a["gpus"]


def transitions(srv: Server, job_id: int) -> list[tuple[str | None, str]]:
    return [(e["from_state"], e["to_state"]) for e in job(srv, job_id).get("events", [])]
