"""Real pieces for service tests: an agent on simulated GPUs in a thread of the test
(``failover.conftest.Node``) that runs real replica processes as the job account, and a
``gpufleet gateway`` process following a server's feed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from failover.conftest import Node
from gpufleet.agent import AgentConfig, HttpTransport, SimSpec, SimulatedProbe, make_agent
from jobaccounts import run_as
from server.conftest import ADMIN_TOKEN, Server, ok, unique

OPERATOR_ENV = {"GPUFLEET_TOKEN": ADMIN_TOKEN}
GATEWAY = (sys.executable, "-m", "gpufleet", "gateway")


def sim_node(
    srv: Server, work: Path, *, pool: str, leaf: str | None = None, gpus: int = 1, grace_s: float = 5.0
) -> Node:
    """A registered node with its agent running (syncs every 0.25 s, probes replicas
    every 0.2 s), ``gpus`` simulated GPUs."""
    name = unique("snode")
    with srv.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": []}))
        token = ok(c.post("/nodes/join-tokens", json={"node": name}), 201)["token"]
    config = AgentConfig(
        node=name,
        work_dir=work / name,
        address="127.0.0.1",
        sync_interval_s=0.25,
        news_gap_s=0.0,
        tick_s=0.05,
        grace_s=grace_s,
        health_interval_s=0.1,
        probe_interval_s=0.2,
        **({} if leaf is None else {"leaf": leaf}),
    )
    probe = SimulatedProbe(node=name, spec=SimSpec(gpus=gpus))
    agent = make_agent(config=config, probe=probe, transport=HttpTransport(srv.url, token), run_as=run_as())
    node = Node(name=name, agent=agent, probe=probe)
    node.agent.sync_once()
    node.resume()
    return node


def start_gateway(
    srv: Server, port: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A ``gpufleet gateway`` process following ``srv``'s feed every 0.2 s, with ``args``;
    its credential from ``args`` or ``env`` only (``ADMIN_TOKEN``: pass
    ``env=OPERATOR_ENV``), never on its command line unless a test says so."""
    base = {k: v for k, v in os.environ.items() if k != "GPUFLEET_TOKEN"}
    return subprocess.Popen(
        [*GATEWAY, "--server", srv.url, "--port", str(port), "--refresh", "0.2", *args],
        env={**base, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def gateway_up(proc: subprocess.Popen[bytes], port: int, timeout: float = 30.0) -> None:
    """Wait until the gateway answers ``/healthz``: before a service deploys, so no
    replica's port (the agents pick free ports) can be the one the gateway was given and
    has not bound yet; a gateway that exited says why."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise AssertionError(f"the gateway exited ({proc.returncode}): {err[-2000:]}")
        assert time.monotonic() < deadline, "the gateway did not answer /healthz"
        time.sleep(0.1)
