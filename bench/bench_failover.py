"""Failover figures: time from a GPU fault to that GPU cordoned (and its job running
again on another GPU), from an agent's loss to its jobs requeued and running elsewhere,
and one seeded chaos run (the test's harness).

    .venv/bin/python bench/bench_failover.py [--repeats 5] [--no-chaos]

A real server (SQLite) with short lifecycle timings (node timeout 2 s, requeue-after
3 s: the lost window is 5 s, 90 s with the defaults), in-process agents with simulated
GPUs (sync every 1 s instead of 10 s, so a sync still comes well inside the node
timeout; GPU checks every 2 s as by default). Prints tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from failover.chaos import ChaosConfig, run_chaos  # noqa: E402
from failover.conftest import Node, job, running_on, until  # noqa: E402
from gpufleet.agent import AgentConfig, HttpTransport, SimSpec, SimulatedProbe, make_agent  # noqa: E402
from server.conftest import Server, make_team, ok, start_server, stop_server, unique  # noqa: E402

NODE_TIMEOUT_S, REQUEUE_AFTER_S, SYNC_S = 2.0, 3.0, 1.0  # the defaults (30 s, 60 s, 10 s) / 15..10
FAULTS: dict[str, Callable[[SimulatedProbe, int], None]] = {
    "xid 79 (off the bus)": lambda p, g: p.xid(g, 79),
    "ecc double-bit": lambda p, g: p.ecc_double_bit(g),
    "gpu lost": lambda p, g: p.lose(g),
    "retired pages": lambda p, g: p.retire_pages(g, 64),
    "overheat (hot-for 5 s)": lambda p, g: p.overheat(g),
}


def new_node(srv: Server, work: Path, pool: str, gpus: int) -> Node:
    name = unique("bench")
    with srv.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": []}))
    config = AgentConfig(
        node=name, work_dir=work / name, address="127.0.0.1", grace_s=1.0, tick_s=0.1, sync_interval_s=SYNC_S
    )
    probe = SimulatedProbe(node=name, spec=SimSpec(gpus=gpus))
    agent = make_agent(config=config, probe=probe, transport=HttpTransport(srv.url, "gf_test_admin_token"))
    node = Node(name=name, agent=agent, probe=probe)
    agent.sync_once()
    node.resume()
    return node


def submit(srv: Server, team: str, pool: str) -> int:
    body = {"command": ["sim"], "team": team, "pool": pool, "env": {"GPUFLEET_SIMULATE_S": "600"}}
    with srv.client() as c:
        return int(ok(c.post("/jobs", json=body), 201)["id"])


def gpu_fault(
    srv: Server, team: str, work: Path, inject: Callable[[SimulatedProbe, int], None]
) -> tuple[float, float]:
    pool = unique("bp")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    node = new_node(srv, work, pool, 2)
    try:
        jid = submit(srv, team, pool)
        bad = until(lambda: running_on(srv, jid), timeout=30)[1][0]
        t0 = time.monotonic()
        inject(node.probe, bad)
        until(lambda: any(g["cordoned"] for g in ok(srv.client().get(f"/nodes/{node.name}"))["gpus"]), 60)
        cordoned = time.monotonic() - t0
        until(lambda: (r := running_on(srv, jid)) and r[1] != [bad], 60)
        return cordoned, time.monotonic() - t0
    finally:
        node.close()


def node_loss(srv: Server, team: str, work: Path) -> tuple[float, float]:
    pool = unique("bp")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    a = new_node(srv, work, pool, 1)
    jid = submit(srv, team, pool)
    until(lambda: running_on(srv, jid), timeout=30)
    b = new_node(srv, work, pool, 1)
    try:
        last = time.monotonic()
        a.pause()  # the agent stops talking (a crash, a partition)
        until(lambda: any(e["to_state"] == "REQUEUED" for e in job(srv, jid)["events"]), 60)
        requeued = time.monotonic() - last
        until(lambda: (r := running_on(srv, jid)) and r[0] == b.name, 60)
        return requeued, time.monotonic() - last
    finally:
        a.close()
        b.close()


def table(title: str, rows: list[tuple[str, list[float], list[float]]], cols: tuple[str, str]) -> None:
    print(f"\n{title}")
    print(f"{'case':<26} {cols[0] + ' p50/max (s)':>26} {cols[1] + ' p50/max (s)':>30}")
    for name, xs, ys in rows:
        a, b = f"{statistics.median(xs):.2f} / {max(xs):.2f}", f"{statistics.median(ys):.2f} / {max(ys):.2f}"
        print(f"{name:<26} {a:>26} {b:>30}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-chaos", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        extra = ("--node-timeout", f"{NODE_TIMEOUT_S}s", "--requeue-after", f"{REQUEUE_AFTER_S}s")
        srv = start_server(f"sqlite:///{work / 'bench.db'}", extra=(*extra, "--gpu-hot-for", "5s"))
        try:
            team = make_team(srv)
            rows = []
            for name, inject in FAULTS.items():
                got = [gpu_fault(srv, team, work, inject) for _ in range(args.repeats)]
                rows.append((name, [g[0] for g in got], [g[1] for g in got]))
            table(
                "GPU fault -> GPU cordoned -> job running on another GPU", rows, ("cordoned", "running again")
            )
            got = [node_loss(srv, team, work) for _ in range(args.repeats)]
            window = NODE_TIMEOUT_S + REQUEUE_AFTER_S
            table(
                f"agent silent -> requeued -> running elsewhere (lost window {window:g} s; default 90 s)",
                [("agent lost", [g[0] for g in got], [g[1] for g in got])],
                ("requeued", "running again"),
            )
        finally:
            stop_server(srv)
        if not args.no_chaos:
            (work / "chaos").mkdir()
            print("\n" + run_chaos(ChaosConfig(seed=7), work / "chaos").line())


if __name__ == "__main__":
    main()
