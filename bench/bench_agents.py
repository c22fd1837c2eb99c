"""Many agents against one server: sync latency and server CPU.

Starts ``gpufleet server`` (subprocess, temp SQLite) once per agent count, then runs
that many simulated agents (8 simulated H100s each, telemetry in every sync) in
``--procs`` worker processes of asyncio tasks; each agent syncs every ``--interval``
seconds (random phase) through the real ``Agent.build_sync`` / ``Agent.apply``. A
trickle of simulated jobs (``--jobs-per-s``, 1-8 GPUs, 20-40 s) keeps the write path
busy: jobs are placed, started, reported running and exited.

After ``--warmup`` seconds (registration) it measures for ``--seconds``:
server p50/p99 sync handling time (from ``GET /v1/fleet/summary``, last minute),
client-side p99 (includes the workers' own scheduling on this machine), and the
server process's CPU time / wall time. Target: p99 <= 100 ms, CPU <= 1 core. With
``--wait on`` (``both``: a row each way) every agent also holds its long-poll open, as the
real agent does (push dispatch); ``waiting`` is ``gpufleet_agents_waiting`` at the end:
1,000 open long-polls should cost the server next to nothing.

    .venv/bin/python bench/bench_agents.py [--agents 250,500,1000] [--procs 4] [--wait both|on|off]
        [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

TOKEN = "gf_bench_agents_admin"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]


def start_server(tmp: Path) -> Server:
    db_url = f"sqlite:///{tmp / 'bench.db'}"
    subprocess.run(
        [sys.executable, "-m", "gpufleet", "db", "upgrade", "--database-url", db_url],
        check=True,
        capture_output=True,
    )
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db_url],
        env={**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/v1/healthz", timeout=1).status_code == 200:
                return Server(url=url, proc=proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


def worker(
    url: str, names: list[str], interval: float, until: float, measure_from: float, work: str, wait: bool
) -> list[float]:
    """One worker process: its agents as asyncio tasks. Returns client latencies (s) of
    the syncs that started inside the measured window. ``wait``: each agent also keeps
    its long-poll open (``GET /v1/nodes/{name}/wait``) and syncs at once when it is
    answered with a new version, as the real agent does."""
    from gpufleet.agent import AgentConfig, SimSpec, SimulatedProbe, make_agent

    class _Unused:
        def sync(self, node: str, body: dict[str, object]) -> dict[str, object]:
            raise AssertionError("the bench drives the HTTP itself")

        def close(self) -> None:
            pass

    agents = [
        make_agent(
            config=AgentConfig(node=n, work_dir=Path(work) / n, leaf=f"leaf-{i // 10}", address="127.0.0.1"),
            probe=SimulatedProbe(node=n, spec=SimSpec(gpus=8)),
            transport=_Unused(),
        )
        for i, n in enumerate(names)
    ]
    lat: list[float] = []

    async def waiter(client: httpx.AsyncClient, node: str, kick: asyncio.Event) -> None:
        seen: str | None = None
        while (left := until - time.time()) > 0:
            params: dict[str, str | float] = {"timeout": min(random.uniform(34.0, 56.0), left)}
            if seen is not None:
                params["seen"] = seen
            try:
                resp = await client.get(f"/nodes/{node}/wait", params=params, timeout=left + 10)
            except httpx.HTTPError:
                await asyncio.sleep(1.0)
                continue
            if resp.status_code != 200:
                await asyncio.sleep(1.0)
                continue
            version = resp.json()["version"]
            if version != seen:
                seen = version
                kick.set()

    async def run_one(client: httpx.AsyncClient, polls: httpx.AsyncClient, agent: object) -> None:
        from gpufleet.agent import Agent

        assert isinstance(agent, Agent)
        kick = asyncio.Event()
        await asyncio.sleep(random.uniform(0, interval))
        if wait:
            asyncio.get_running_loop().create_task(waiter(polls, agent.config.node, kick))
        while time.time() < until:
            t_start = time.time()
            agent.tick()
            body = agent.build_sync()
            t0 = time.perf_counter()
            try:
                resp = await client.post(f"/nodes/{agent.config.node}/sync", json=body)
                dt = time.perf_counter() - t0
                if resp.status_code == 200:
                    agent.apply(resp.json(), sent=body)
                if t_start >= measure_from:
                    lat.append(dt if resp.status_code == 200 else float("inf"))
            except httpx.HTTPError:
                if t_start >= measure_from:
                    lat.append(float("inf"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kick.wait(), max(0.0, min(until, t_start + interval) - time.time()))
            kick.clear()

    async def main() -> None:
        # syncs share a pool sized as before; the long-polls (one open per agent) have
        # their own, so a sync never waits behind them for a connection
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        waits = httpx.Limits(max_connections=len(agents) + 10, max_keepalive_connections=len(agents) + 10)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx.AsyncClient(base_url=url + "/v1", headers=headers, timeout=60, limits=limits) as c,
            httpx.AsyncClient(base_url=url + "/v1", headers=headers, timeout=60, limits=waits) as polls,
        ):
            await asyncio.gather(*(run_one(c, polls, a) for a in agents))

    asyncio.run(main())
    return lat


def submitter(url: str, rate: float, stop: threading.Event) -> None:
    rng = random.Random(1)
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        c.post("/teams", json={"name": "bench"})
        c.post("/teams/bench/members", json={"user": "admin"})
        while not stop.is_set():
            dur = rng.uniform(20, 40)
            spec = {
                "command": ["sleep", f"{dur:.0f}"],
                "gpus": rng.choice([1, 1, 2, 4, 8]),
                "env": {"GPUFLEET_SIMULATE_S": f"{dur:.1f}"},
            }
            with contextlib.suppress(httpx.HTTPError):
                c.post("/jobs", json=spec)
            stop.wait(1.0 / rate)


@dataclass
class Result:
    agents: int
    waiting: int
    syncs_per_s: float
    server_p50_ms: float | None
    server_p99_ms: float | None
    client_p99_ms: float
    failed: int
    cpu_cores: float
    jobs_completed: int

    @property
    def ok(self) -> bool:
        return (self.server_p99_ms or 1e9) <= 100 and self.cpu_cores <= 1.0 and self.failed == 0


def profile(srv: Server, args: argparse.Namespace, n: int) -> subprocess.Popen[bytes] | None:
    """``--profile DIR``: py-spy samples the server (all threads, with idle ones, GIL
    holder marked) over the measured window into ``DIR/agents-N.txt`` (collapsed stacks)."""
    if not args.profile:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.profile) / f"agents-{n}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [spy, "record", "--pid", str(srv.proc.pid), "--duration", str(int(args.seconds)), "--rate", "200"]
    cmd += ["--format", "raw", "--threads", "--gil", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def waiting_now(c: httpx.Client) -> int:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("gpufleet_agents_waiting "):
            return int(float(line.split()[1]))
    return 0


def run(n: int, args: argparse.Namespace, wait: bool) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp))
        try:
            names = [f"bench-{i:04d}" for i in range(n)]
            procs = max(1, min(args.procs, n))
            t0 = time.time() + 3.0  # workers' import time
            measure_from = t0 + args.warmup
            until = measure_from + args.seconds
            stop = threading.Event()
            if args.jobs_per_s > 0:
                threading.Thread(target=submitter, args=(srv.url, args.jobs_per_s, stop), daemon=True).start()
            ps = psutil.Process(srv.proc.pid)
            cpu0 = wall0 = 0.0
            # spawn, not fork: a worker forked while the submitter thread holds a lock
            # (OpenSSL's, in httpx) can hang for good, its agents never syncing
            with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
                futs = [
                    pool.submit(
                        worker,
                        srv.url,
                        names[i::procs],
                        args.interval,
                        until,
                        measure_from,
                        f"{tmp}/w{i}",
                        wait,
                    )
                    for i in range(procs)
                ]
                time.sleep(max(0.0, measure_from - time.time()))
                ct = ps.cpu_times()
                cpu0, wall0 = ct.user + ct.system, time.time()
                spy = profile(srv, args, n)
                time.sleep(max(0.0, measure_from + args.seconds / 2 - time.time()))
                with httpx.Client(
                    base_url=srv.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
                ) as c:
                    waiting = waiting_now(c) if wait else 0  # mid-window: every long-poll open
                time.sleep(max(0.0, until - time.time()))
                ct = ps.cpu_times()
                cpu1, wall1 = ct.user + ct.system, time.time()
                with httpx.Client(
                    base_url=srv.url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
                ) as c:
                    summary = c.get("/fleet/summary").json()
                lat = [x for f in futs for x in f.result()]
            stop.set()
            if spy is not None:
                spy.wait(timeout=60)
        finally:
            srv.proc.terminate()
            srv.proc.wait(timeout=20)
    good = sorted(x for x in lat if x != float("inf"))
    return Result(
        agents=n,
        waiting=waiting,
        syncs_per_s=len(lat) / args.seconds,
        server_p50_ms=summary["sync"]["p50_ms"],
        server_p99_ms=summary["sync"]["p99_ms"],
        client_p99_ms=1000 * good[int(0.99 * (len(good) - 1))] if good else float("nan"),
        failed=len(lat) - len(good),
        cpu_cores=(cpu1 - cpu0) / (wall1 - wall0),
        jobs_completed=int(summary["jobs"].get("COMPLETED", 0)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="250,500,1000")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--jobs-per-s", type=float, default=2.0)
    ap.add_argument("--profile", metavar="DIR", help="record the server with py-spy into DIR")
    ap.add_argument(
        "--wait",
        choices=("both", "on", "off"),
        default="both",
        help="agents also hold their long-poll open (push dispatch): on, off, or both (a row each)",
    )
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; sync every {args.interval:g}s, 8 GPUs each, {args.procs} procs")
    cols = (
        "agents",
        "waiting",
        "syncs/s",
        "srv p50",
        "srv p99",
        "cli p99",
        "failed",
        "cpu",
        "jobs done",
        "ok",
    )
    print("  ".join(f"{c:>9}" for c in cols))
    results = []
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.wait]
    for n, wait in [(int(x), w) for x in args.agents.split(",") for w in modes]:
        r = run(n, args, wait)
        results.append(r)
        row = (
            r.agents,
            r.waiting if wait else "-",
            f"{r.syncs_per_s:.1f}",
            f"{r.server_p50_ms or 0:.1f}ms",
            f"{r.server_p99_ms or 0:.1f}ms",
            f"{r.client_p99_ms:.1f}ms",
            r.failed,
            f"{r.cpu_cores:.2f}",
            r.jobs_completed,
            "yes" if r.ok else "NO",
        )
        print("  ".join(f"{v:>9}" for v in row), flush=True)
    passing = [r.agents for r in results if r.ok]
    print(f"largest agent count meeting p99 <= 100 ms and <= 1 core: {max(passing) if passing else 'none'}")


if __name__ == "__main__":
    main()
