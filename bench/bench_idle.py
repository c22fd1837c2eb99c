"""A fleet at rest: what 50 idle simulated nodes cost the server and their agents (issue 35).

Starts ``gpufleet server`` (subprocess, temp SQLite) and one agents process that runs
``--nodes`` real agents the way ``gpufleet demo`` does (``make_agent`` over HTTP with
``SimulatedProbe`` nodes of 8 H100s, ``--threads`` threads of agents stepping in turn,
each agent's long-poll open, each thread waiting the agents' ``tick_s`` between
turns), with no job at all. After ``--settle`` seconds it measures
for ``--seconds``:

- server CPU-s per minute (the server process and its children; ``(child)``: the
  children's share, the scheduling pass's process),
- agents CPU-s per minute (the agents process),
- database commits per minute (``PRAGMA data_version`` polled every 20 ms from a
  connection of the bench's own: each change is a commit by the server),
- how many nodes are Ready at the end (all of them, or the run is marked ``NO``).

Median of ``--runs`` runs per row; one row per ``--interval`` (the agents' sync interval;
2 s is what the demo used before issue 35, 10 s a real agent's default). Target: server
under 0.5 CPU-s/min, server and agents together under 1. With ``--baseline SRC`` (a
``src`` folder of another checkout) each row is measured for that code too, the runs of
the two alternating (this machine's speed drifts), with the ratio after / before.

    flock /tmp/bench.lock .venv/bin/python bench/bench_idle.py [--nodes 50] [--interval 2,10]
        [--runs 3] [--settle 20] [--seconds 60] [--profile FILE] [--baseline /tmp/b/src]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_agents import TOKEN, Server, _port


def agents_main(url: str, nodes: int, interval: float, threads: int, work: str) -> None:
    """The agents process: ``nodes`` agents as the demo runs them, until SIGTERM."""
    from gpufleet.agent import Agent, AgentConfig, HttpTransport, SimSpec, SimulatedProbe, make_agent

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    agents = [
        make_agent(
            config=AgentConfig(
                node=f"node-{i:03d}",
                work_dir=Path(work) / f"node-{i:03d}",
                leaf=f"leaf-{i // 10}",
                rack=f"rack-{i // 20}",
                address="127.0.0.1",
                sync_interval_s=interval,
                grace_s=5.0,
            ),
            probe=SimulatedProbe(node=f"node-{i:03d}", spec=SimSpec(gpus=8, model="H100-80GB")),
            transport=HttpTransport(url, TOKEN),
        )
        for i in range(nodes)
    ]

    def run(mine: list[Agent]) -> None:  # as ``demo.Demo._run_agents``
        random.Random(len(mine)).shuffle(mine)
        tick_s = min((bot.config.tick_s for bot in mine), default=0.5)
        kick = threading.Event()
        for bot in mine:
            bot.kick = kick
            bot.start_watch(stop)
        while not stop.is_set():
            for bot in mine:
                with contextlib.suppress(Exception):
                    bot.step()
            kick.wait(tick_s)
            kick.clear()

    groups = max(1, min(threads, len(agents)))
    ts = [threading.Thread(target=run, args=(agents[g::groups],), daemon=True) for g in range(groups)]
    for t in ts:
        t.start()
    stop.wait()


def tree_env(src: str | None) -> dict[str, str]:
    """The environment that runs ``src``'s gpufleet (None: the installed one)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env


def start_server(tmp: Path, profile: str | None, src: str | None = None) -> Server:
    db_url = f"sqlite:///{tmp / 'bench.db'}"
    subprocess.run(
        [sys.executable, "-m", "gpufleet", "db", "upgrade", "--database-url", db_url],
        check=True,
        capture_output=True,
        env=tree_env(src),
    )
    port = _port()
    cmd = [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db_url]
    if profile:  # every thread's calls (cProfile alone sees the main thread only)
        cmd = [sys.executable, __file__, "--profiled-server", profile, *cmd[3:]]
    proc = subprocess.Popen(
        cmd, env={**tree_env(src), "GPUFLEET_ADMIN_TOKEN": TOKEN}, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/v1/healthz", timeout=1).status_code == 200:
                return Server(url=url, proc=proc)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


def profiled_server(out: str, argv: list[str]) -> None:
    """``gpufleet server`` with a cProfile in each thread, merged into ``out`` at exit."""
    import atexit
    import cProfile
    import pstats

    from gpufleet.cli import main as cli

    profiles: list[cProfile.Profile] = []

    def hook(*_: object) -> None:
        p = cProfile.Profile()
        profiles.append(p)
        p.enable()

    def dump() -> None:
        for p in profiles:
            with contextlib.suppress(Exception):
                p.disable()
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            with contextlib.suppress(TypeError):
                stats.add(p)
        stats.dump_stats(out)

    atexit.register(dump)
    threading.setprofile(hook)
    hook()
    sys.argv = ["gpufleet", *argv]
    cli()


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of a process, and of its live children."""
    p = psutil.Process(pid)
    out = [0.0, 0.0]
    for i, q in enumerate([p, *p.children(recursive=True)]):
        with contextlib.suppress(psutil.Error):
            t = q.cpu_times()
            out[min(i, 1)] += t.user + t.system
    return out[0], out[1]


def count_commits(db: Path, until: float) -> int:
    conn = sqlite3.connect(db, timeout=5)
    try:
        last = conn.execute("PRAGMA data_version").fetchone()[0]
        n = 0
        while time.time() < until:
            time.sleep(0.02)
            v = conn.execute("PRAGMA data_version").fetchone()[0]
            if v != last:
                n, last = n + 1, v
        return n
    finally:
        conn.close()


def ready(url: str) -> int:
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        return int(c.get("/fleet/summary").json()["nodes_ready"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    server: float
    child: float
    agents: float
    commits: float
    ready: int


def once(args: argparse.Namespace, interval: float, profile: str | None, src: str | None = None) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp), profile, src)
        more = (str(args.threads), f"{tmp}/agents")
        child = subprocess.Popen(
            [sys.executable, __file__, "--agents-child", srv.url, str(args.nodes), str(interval), *more],
            env=tree_env(src),
        )
        try:
            time.sleep(args.settle)
            (s0, c0), a0, t0 = cpu_s(srv.proc.pid), sum(cpu_s(child.pid)), time.time()
            commits = count_commits(Path(tmp) / "bench.db", t0 + args.seconds)
            (s1, c1), a1, t1 = cpu_s(srv.proc.pid), sum(cpu_s(child.pid)), time.time()
            up = ready(srv.url)
        finally:
            child.terminate()
            child.wait(timeout=30)
            srv.proc.send_signal(signal.SIGINT)  # cProfile writes its file on a clean exit
            try:
                srv.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                srv.proc.kill()
    per_min = 60.0 / (t1 - t0)
    return Run(
        server=(s1 - s0 + c1 - c0) * per_min,
        child=(c1 - c0) * per_min,
        agents=(a1 - a0) * per_min,
        commits=commits * per_min,
        ready=up,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--profiled-server":
        profiled_server(sys.argv[2], sys.argv[3:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--agents-child":
        url, nodes, every, threads, work = sys.argv[2:7]
        agents_main(url, int(nodes), float(every), int(threads), work)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--interval", default="2,10", help="agents' sync intervals (s), one row each")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--profile", metavar="FILE", help="cProfile the server of the first run into FILE")
    ap.add_argument("--baseline", metavar="SRC", help="also run this src folder's code (PYTHONPATH)")
    args = ap.parse_args()
    trees: list[tuple[str, str | None]] = [("", None)]
    if args.baseline:
        trees = [("before", args.baseline), ("after", None)]
    print(
        f"machine: {os.cpu_count()} CPUs; {args.nodes} idle nodes x 8 GPUs; median of {args.runs}"
        + (f"; before = {args.baseline}" if args.baseline else "")
    )
    cols = ("interval", "code", "server", "(child)", "agents", "total", "commits", "ready", "ok")
    print("  ".join(f"{c:>9}" for c in cols) + "   (CPU-s and commits per minute)")
    for k, interval in enumerate(float(x) for x in args.interval.split(",")):
        runs: dict[str, list[Run]] = {label: [] for label, _ in trees}
        for i in range(args.runs):  # the trees alternate: a drift in speed hits both
            for label, src in trees:
                profile = args.profile if k == 0 and i == 0 and src is None else None
                runs[label].append(once(args, interval, profile, src))
        totals: dict[str, float] = {}
        for label, _ in trees:
            rs = runs[label]
            cpu = statistics.median(r.server for r in rs)
            kid = statistics.median(r.child for r in rs)
            agt = statistics.median(r.agents for r in rs)
            com = statistics.median(r.commits for r in rs)
            up = min(r.ready for r in rs)
            ok = cpu < 0.5 and cpu + agt < 1.0 and up == args.nodes
            totals[label] = cpu
            row = (
                f"{interval:g}s",
                label or "-",
                f"{cpu:.2f}",
                f"{kid:.2f}",
                f"{agt:.2f}",
                f"{cpu + agt:.2f}",
                f"{com:.0f}",
                up,
            )
            print("  ".join(f"{v:>9}" for v in (*row, "yes" if ok else "NO")), flush=True)
        if args.baseline and totals["before"] > 0:
            print(f"{'':>9}  server after / before: {totals['after'] / totals['before']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
