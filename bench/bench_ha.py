"""Several servers on one PostgreSQL (issue 19): how long a leader's loss stops scheduling,
whether submits scale out over API servers, and agents' syncs spread over three servers.

    GPUFLEET_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
    .venv/bin/python bench/bench_ha.py [--repeats 5] [--leader-ttl 6] [--servers 1,2,3]
        [--seconds 5] [--runs 3] [--clients 8] [--clients-per-server 8]
        [--agents 500,1000] [--agent-seconds 60] [--no-takeover] [--no-submits] [--no-agents] [--no-chaos]

The defaults take about 8 minutes; ``--repeats 3 --runs 1 --agents 500 --agent-seconds 30``
and the ``--no-*`` switches scale it down.

Every part runs on a database of its own made next to the given one (dropped after);
servers are ``gpufleet server`` processes with their defaults unless said. Prints tables:

1. **takeover** (``--repeats``, default 5; goal: median <= 15 s, Slurm's default takeover
   is 120 s). Three servers, ``--leader-ttl`` (default 6 s, the server's default), one
   registered 8-GPU node. Each repeat SIGKILLs the leader (found with
   ``GET /v1/fleet/servers``) at a random phase of its renewals, submits a 1-GPU job through
   a surviving server right after, and waits until it is placed. *first pass* = SIGKILL ->
   the ``at`` of that job's SCHEDULED event, written by the new leader's first scheduling
   pass (the pass's start, that server's clock; the event carries the new epoch, which the
   bench checks). *lease* = SIGKILL -> the new term's ``leader_terms.acquired_at``
   (PostgreSQL's clock): the part spent waiting for the lease to expire. *seen* = SIGKILL
   -> the client saw the job SCHEDULED. One machine, one clock, so the differences hold.
   Then the job is cancelled and the killed server started again (three remain).
2. **submits** with 1, 2, 3 servers (``--servers``) on one PostgreSQL: client processes
   (``bench_api.RawConnection``: a prepared keep-alive request, ~0.1 ms of CPU each),
   spread round-robin over the servers, ``POST /v1/jobs`` back to back for ``--seconds``,
   ``--runs`` times (medians), on a 50 x 8-GPU fleet; ``--rate-admin off``. Two tables:
   ``--clients`` in all (8: the same offered load whatever N), then
   ``--clients-per-server`` each (8: the load grows with N, as when servers are added
   for more clients). ``vs 1`` is the rate over the 1-server row's. ``srv``/``API``/``db
   ms/job``: CPU per job of the servers (the leader's scheduling child included), of their
   API processes, and of the PostgreSQL backends serving this database; ``cores busy``:
   all of it and the clients', in cores; ``jobs/batch``: jobs per group commit (the
   transactions of their first events, ``xmin``). Each server batches only the submits it
   receives, so spreading a fixed load over more servers makes smaller commits, each with
   the same fixed cost. On this bench's machine (2 cores for everything) one server's API
   process already takes about half of it: the ratio shows whether a server's work grows
   with N, not what N machines would do.
3. **agents**: ``--agents`` simulated agents (``bench_agents.worker``: a real ``Agent``'s
   build_sync/apply per sync, 8 simulated GPUs each, asyncio in worker processes), each
   agent given one of three servers round-robin, syncing every ``--interval`` s (10 s,
   the agent's default) for ``--agent-seconds`` after a warm-up; a trickle of jobs
   (``--jobs-per-s``). Client p99 over all syncs, the servers' own p99 (the worst of the
   three, ``GET /v1/fleet/summary``: its last minute, hence 60 s measured), the servers'
   CPU and CPU ms per sync, the simulated agents' CPU and PostgreSQL's, and the database
   connections the servers held (each may open 32: 1,500 agents took 76 here, of the
   100 PostgreSQL allows by default; mind a shared database server).
   The issue asks for 10,000 agents: at 10 s that is 1,000 syncs/s, several cores of
   servers and more of simulated agents, where this bench's machine has 2 cores in all
   (500 and 1,000 agents fit; 1,500 did not keep up). The last lines name the largest
   count whose syncs all came on time and what 10,000 would take in server cores, from
   the CPU one more sync costs.
4. **chaos**: the issue's own scenario (``chaos.issue_scenario``: 3 servers, 20 agents, a
   submit storm through all three, SIGKILL the leader, SIGSTOP the next one for 40 s),
   its summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from bench_agents import TOKEN as AGENTS_TOKEN  # noqa: E402
from bench_agents import submitter, worker  # noqa: E402
from bench_api import JOB, Call, Running  # noqa: E402
from bench_api import TOKEN as API_TOKEN  # noqa: E402
from bench_api import _worker as load_worker  # noqa: E402  (bench_api's client process, as it is)
from failover.chaos import ChaosConfig, Cluster, issue_scenario, run_chaos  # noqa: E402
from server.conftest import drop_postgres, free_port, own_postgres  # noqa: E402


@contextlib.contextmanager
def scratch(pg: str, label: str) -> Iterator[str]:
    url = own_postgres(pg, f"gpufleet_bench_ha_{label}_{os.getpid()}")
    try:
        yield url
    finally:
        drop_postgres(url)


def start_servers(
    db_url: str, n: int, *, token: str, work: Path, extra: tuple[str, ...] = ()
) -> list[Running]:
    """``n`` servers on ``db_url`` (the first makes the schema, then the others at once);
    their logs in ``work``."""
    out: list[Running] = []
    for i in range(n):
        port = free_port()
        cmd = [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db_url]
        with (work / f"server{i}-{port}.log").open("ab") as log:
            proc = subprocess.Popen(
                [*cmd, *extra],
                env={**os.environ, "GPUFLEET_ADMIN_TOKEN": token},
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        out.append(Running(url=f"http://127.0.0.1:{port}", proc=proc))
        if i == 0:
            wait_up(out[0])
    for srv in out[1:]:
        wait_up(srv)
    return out


def wait_up(srv: Running, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(srv.url + "/v1/healthz", timeout=1).status_code == 200:
                return
        if srv.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"server {srv.url} did not start (its log is in the work directory)")


def stop_servers(servers: list[Running]) -> None:
    for srv in servers:
        srv.proc.terminate()
    for srv in servers:
        try:
            srv.proc.wait(15)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()


def cpu_s(servers: list[Running]) -> float:
    return sum(sum(srv.cpu_s()) for srv in servers)


def api_cpu_s(servers: list[Running]) -> float:
    """The API processes' part of ``cpu_s`` (the rest: the leader's scheduling child)."""
    return sum(srv.cpu_s()[0] for srv in servers)


class DbCpu:
    """CPU seconds of the PostgreSQL backends serving one database (``pg_stat_activity``;
    the server runs on this machine): a backend that came or went inside the window is
    counted from when it was first seen."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def reset(self) -> None:
        self.first.clear()
        self.last.clear()

    def sample(self) -> None:
        with self.engine.connect() as c:
            pids = c.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).scalars()
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    t = psutil.Process(pid).cpu_times()
                    self.first.setdefault(pid, t.user + t.system)
                    self.last[pid] = t.user + t.system

    def used_s(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)

    def connections(self) -> int:
        return len(self.last)

    def close(self) -> None:
        self.engine.dispose()


# -- 1. takeover ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Takeover:
    lease_s: float
    first_pass_s: float
    seen_s: float


def takeovers(pg: str, work: Path, args: argparse.Namespace) -> list[Takeover]:
    extra = ("--scheduler-thread",) if args.scheduler_thread else ()
    with scratch(pg, "takeover") as url:
        cfg = ChaosConfig(  # the node has no agent: it must not be declared lost
            servers=3,
            agents=0,
            node_timeout_s=3600.0,
            requeue_after_s=3600.0,
            database_url=url,
            leader_ttl_s=args.leader_ttl,
            server_args=extra,
        )
        (work / "takeover").mkdir()
        cl = Cluster(cfg, work / "takeover")
        try:
            cl.start_all()
            cl.call("PUT", "/nodes/n0", json={"gpus": [{"index": i, "model": "H100"} for i in range(8)]})
            return [one_takeover(cl, args.leader_ttl) for _ in range(args.repeats)]
        finally:
            cl.close()


def one_takeover(cl: Cluster, ttl: float) -> Takeover:
    assert cl.engine is not None
    i, epoch = cl.leader()
    time.sleep(random.uniform(0, ttl / 3))  # a random phase against the leader's renewals
    t0 = time.time()
    cl.kill_server(i)
    jid = cl.call("POST", "/jobs", json={"command": ["true"], "gpus": 1, "team": "chaos"})["id"]
    while cl.call("GET", f"/jobs/{jid}")["state"] == "PENDING":
        if time.time() - t0 > 120:
            raise SystemExit(f"job {jid} not placed 120 s after the leader's SIGKILL")
        time.sleep(0.02)
    seen = time.time() - t0
    with cl.engine.connect() as c:
        at, placed_by = c.execute(
            text("SELECT at, epoch FROM job_events WHERE job_id = :j AND to_state = 'SCHEDULED'"), {"j": jid}
        ).one()
        acquired = c.execute(
            text("SELECT acquired_at FROM leader_terms WHERE epoch = :e"), {"e": placed_by}
        ).scalar_one()
    if placed_by is None or placed_by <= epoch:
        raise SystemExit(f"job {jid} placed under epoch {placed_by}, not by a leader after epoch {epoch}")
    cl.call("POST", f"/jobs/{jid}/cancel")
    cl.start_server(i)  # three servers again
    return Takeover(lease_s=acquired - t0, first_pass_s=at - t0, seen_s=seen)


def takeover_table(got: list[Takeover], args: argparse.Namespace) -> None:
    ttl = args.leader_ttl
    how = "scheduling in a thread" if args.scheduler_thread else "scheduling in a child process (default)"
    print(f"\nleader SIGKILL -> new leader's first scheduling pass: 3 servers, --leader-ttl {ttl:g}s, {how}")
    print(f"(lease expiry bound: ttl + ttl/3 = {ttl * 4 / 3:.1f} s; goal: median first pass <= 15 s)")
    print(f"{'':<12} {'lease taken':>12} {'first pass':>12} {'seen':>8}")
    cols = [[g.lease_s for g in got], [g.first_pass_s for g in got], [g.seen_s for g in got]]
    for name, pick in (("median", statistics.median), ("min", min), ("max", max)):
        print(f"{name:<12} {pick(cols[0]):>11.2f}s {pick(cols[1]):>11.2f}s {pick(cols[2]):>7.2f}s")
    print("each: " + ", ".join(f"{g.first_pass_s:.2f}" for g in got))
    med = statistics.median(cols[1])
    print(f"goal median first pass <= 15 s: {'met' if med <= 15 else 'MISSED'} ({med:.2f} s; Slurm: 120 s)")


# -- 2. submits over 1..3 servers ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rate:
    rate: float
    p50_ms: float
    p99_ms: float
    server_ms: float
    api_ms: float
    db_ms: float
    cores: float  # servers + PostgreSQL + clients, in cores
    connections: int
    per_commit: float = 0.0  # jobs a group commit carried (all runs of this row)


def submits(pg: str, n: int, clients: int, work: Path, args: argparse.Namespace) -> list[Rate]:
    call = Call(method="POST", path="/v1/jobs", body=json.dumps(JOB).encode(), status=201)
    with scratch(pg, f"submit{n}x{clients}") as url:
        (work / f"submit{n}x{clients}").mkdir(exist_ok=True)
        servers = start_servers(
            url, n, token=API_TOKEN, work=work / f"submit{n}x{clients}", extra=("--rate-admin", "off")
        )
        db = DbCpu(url)
        try:
            with httpx.Client(
                base_url=servers[0].url + "/v1", headers={"Authorization": f"Bearer {API_TOKEN}"}
            ) as c:
                for k in range(50):
                    spec = {
                        "leaf": f"leaf-{k // 8}",
                        "gpus": [{"index": i, "model": "H100"} for i in range(8)],
                    }
                    c.put(f"/nodes/node{k:03d}", json=spec).raise_for_status()
            out = []
            for _ in range(args.runs):
                with ProcessPoolExecutor(clients) as pool:
                    begin = time.time() + 1.0 + 0.1 * clients
                    futs = [
                        pool.submit(load_worker, servers[k % n].url, call, "raw", begin, args.seconds)
                        for k in range(clients)
                    ]
                    time.sleep(max(0.0, begin - time.time()))
                    db.reset()
                    db.sample()
                    cpu0, api0 = cpu_s(servers), api_cpu_s(servers)
                    time.sleep(args.seconds)
                    cpu1, api1 = cpu_s(servers), api_cpu_s(servers)
                    db.sample()
                    parts = [f.result() for f in futs]
                lat = sorted(x for p, _ in parts for x in p)
                done = max(1, len(lat))
                out.append(
                    Rate(
                        rate=len(lat) / args.seconds,
                        p50_ms=lat[len(lat) // 2] * 1000,
                        p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
                        server_ms=(cpu1 - cpu0) * 1000 / done,
                        api_ms=(api1 - api0) * 1000 / done,
                        db_ms=db.used_s() * 1000 / done,
                        cores=(cpu1 - cpu0 + db.used_s() + sum(c for _, c in parts)) / args.seconds,
                        connections=db.connections(),
                    )
                )
            with db.engine.connect() as conn:  # a job's first event: a row never updated, whose
                per = conn.execute(  # xmin is the transaction of the group commit that carried it
                    text(
                        "SELECT count(*)::float / count(DISTINCT xmin::text) FROM job_events "
                        "WHERE from_state IS NULL"
                    )
                ).scalar_one()
            return [dataclasses.replace(r, per_commit=float(per)) for r in out]
        finally:
            db.close()
            stop_servers(servers)


def submits_table(rows: dict[int, list[Rate]], clients: str, args: argparse.Namespace) -> None:
    def med(xs: list[Rate], attr: str) -> float:
        return float(statistics.median(getattr(x, attr) for x in xs))

    print(
        f"\nsubmit throughput, N servers on one PostgreSQL: {clients} raw clients spread over them, "
        f"{args.seconds:g}s x {args.runs} runs (medians), {os.cpu_count()} cores shared by all"
    )
    head = (
        "servers",
        "jobs/s",
        "vs 1",
        "p50 ms",
        "p99 ms",
        "srv ms/job",
        "API ms/job",
        "db ms/job",
        "cores busy",
        "db conns",
        "jobs/batch",
    )
    print("  ".join(f"{h:>10}" for h in head))
    base = med(rows[min(rows)], "rate")
    for n, xs in rows.items():
        vals = (
            n,
            f"{med(xs, 'rate'):.0f}",
            f"{med(xs, 'rate') / base:.2f}",
            f"{med(xs, 'p50_ms'):.1f}",
            f"{med(xs, 'p99_ms'):.1f}",
            f"{med(xs, 'server_ms'):.2f}",
            f"{med(xs, 'api_ms'):.2f}",
            f"{med(xs, 'db_ms'):.2f}",
            f"{med(xs, 'cores'):.2f}",
            f"{max(x.connections for x in xs)}",
            f"{xs[0].per_commit:.1f}",
        )
        print("  ".join(f"{v:>10}" for v in vals))


# -- 3. agents over three servers ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agents:
    agents: int
    syncs_per_s: float
    expected_per_s: float
    client_p99_ms: float
    server_p99_ms: float
    failed: int
    server_cores: float
    agent_cores: float
    db_cores: float
    ms_per_sync: float
    connections: int


def workers_cpu_s() -> float:
    """CPU seconds so far of this process's pool workers (the simulated agents)."""
    total = 0.0
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "multiprocessing" in " ".join(p.cmdline()):
                t = p.cpu_times()
                total += t.user + t.system
    return total


def agents_run(pg: str, n: int, work: Path, args: argparse.Namespace) -> Agents:
    with scratch(pg, f"agents{n}") as url:
        here = work / f"agents{n}"
        here.mkdir()
        servers = start_servers(url, 3, token=AGENTS_TOKEN, work=here)
        db = DbCpu(url)
        stop = threading.Event()
        try:
            names = [f"bench-{i:05d}" for i in range(n)]
            procs = max(len(servers), args.procs - args.procs % len(servers))
            t0 = time.time() + 5.0  # the workers' imports
            measure_from = t0 + args.warmup
            until = measure_from + args.agent_seconds
            if args.jobs_per_s > 0:
                threading.Thread(
                    target=submitter, args=(servers[0].url, args.jobs_per_s, stop), daemon=True
                ).start()
            with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
                futs = [
                    pool.submit(
                        worker,
                        servers[k % len(servers)].url,
                        names[k::procs],
                        args.interval,
                        until,
                        measure_from,
                        str(here / f"w{k}"),
                        False,
                    )
                    for k in range(procs)
                ]
                time.sleep(max(0.0, measure_from - time.time()))
                cpu0, ag0, wall0 = cpu_s(servers), workers_cpu_s(), time.time()
                db.sample()
                time.sleep(max(0.0, until - time.time()))
                cpu1, ag1, wall1 = cpu_s(servers), workers_cpu_s(), time.time()
                db.sample()
                p99s = []
                for srv in servers:
                    with httpx.Client(
                        base_url=srv.url + "/v1",
                        headers={"Authorization": f"Bearer {AGENTS_TOKEN}"},
                        timeout=120,
                    ) as c:
                        p99s.append(c.get("/fleet/summary").json()["sync"]["p99_ms"] or 0.0)
                lat = [x for f in futs for x in f.result()]
        finally:
            stop.set()
            db.close()
            stop_servers(servers)
    good = sorted(x for x in lat if x != float("inf"))
    return Agents(
        agents=n,
        syncs_per_s=len(lat) / args.agent_seconds,
        expected_per_s=n / args.interval,
        client_p99_ms=1000 * good[int(0.99 * (len(good) - 1))] if good else float("nan"),
        server_p99_ms=max(p99s),
        failed=len(lat) - len(good),
        server_cores=(cpu1 - cpu0) / (wall1 - wall0),
        agent_cores=(ag1 - ag0) / (wall1 - wall0),
        db_cores=db.used_s() / (wall1 - wall0),
        ms_per_sync=(cpu1 - cpu0) * 1000 / max(1, len(lat)),
        connections=db.connections(),
    )


def agents_table(rows: list[Agents], args: argparse.Namespace) -> None:
    print(
        f"\nagents over 3 servers (round-robin), sync every {args.interval:g}s, "
        f"{args.agent_seconds:g}s measured after {args.warmup:g}s, {os.cpu_count()} cores shared by all"
    )
    head = (
        "agents",
        "syncs/s",
        "of asked",
        "cli p99",
        "srv p99",
        "failed",
        "srv cores",
        "ms/sync",
        "agt cores",
        "db cores",
        "db conns",
    )
    print("  ".join(f"{h:>9}" for h in head))
    for r in rows:
        vals = (
            r.agents,
            f"{r.syncs_per_s:.0f}",
            f"{r.syncs_per_s / r.expected_per_s:.0%}",
            f"{r.client_p99_ms:.0f}ms",
            f"{r.server_p99_ms:.0f}ms",
            r.failed,
            f"{r.server_cores:.2f}",
            f"{r.ms_per_sync:.2f}",
            f"{r.agent_cores:.2f}",
            f"{r.db_cores:.2f}",
            r.connections,
        )
        print("  ".join(f"{v!s:>9}" for v in vals))
    kept = [r for r in rows if r.syncs_per_s >= 0.95 * r.expected_per_s and r.failed == 0]
    if not kept:
        print("no row kept up with its syncs: this machine is saturated (fewer --agents)")
        return
    print(f"largest count whose syncs all came on time: {kept[-1].agents}")
    ms = kept[-1].ms_per_sync  # the servers' whole CPU (their loops too) over their syncs
    how = f"all server CPU / syncs at {kept[-1].agents} agents"
    if len(kept) > 1 and kept[-1].syncs_per_s > kept[0].syncs_per_s:  # what one more sync costs
        ms = (
            1000
            * (kept[-1].server_cores - kept[0].server_cores)
            / (kept[-1].syncs_per_s - kept[0].syncs_per_s)
        )
        how = f"marginal, {kept[0].agents} -> {kept[-1].agents} agents"
    rate = 10_000 / args.interval
    print(
        f"10,000 agents at {args.interval:g}s = {rate:.0f} syncs/s x {ms:.2f} ms/sync ({how}) "
        f"= {rate * ms / 1000:.1f} cores of servers, besides the agents' own"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--leader-ttl", type=float, default=6.0)
    ap.add_argument("--scheduler-thread", action="store_true", help="takeover: servers schedule in a thread")
    ap.add_argument("--servers", default="1,2,3")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8, help="submits: clients in all, whatever N")
    ap.add_argument(
        "--clients-per-server", type=int, default=8, help="submits, then: this many per server (0: not)"
    )
    ap.add_argument("--agents", default="500,1000")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument(
        "--agent-seconds", type=float, default=60.0, help="60: the servers' p99 covers the last minute"
    )
    ap.add_argument("--procs", type=int, default=3, help="agent worker processes (a multiple of 3)")
    ap.add_argument("--jobs-per-s", type=float, default=2.0)
    for part in ("takeover", "submits", "agents", "chaos"):
        ap.add_argument(f"--no-{part}", action="store_true")
    args = ap.parse_args()
    pg = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if not pg or not pg.startswith("postgresql"):
        raise SystemExit("set GPUFLEET_TEST_DATABASE_URL to a PostgreSQL URL (databases are made next to it)")
    print(f"machine: {os.cpu_count()} cores; PostgreSQL {pg.rsplit('@', 1)[-1]}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.no_takeover:
            takeover_table(takeovers(pg, work, args), args)
        if not args.no_submits:
            counts = [int(n) for n in args.servers.split(",")]
            rows = {n: submits(pg, n, args.clients, work, args) for n in counts}
            submits_table(rows, str(args.clients), args)
            if args.clients_per_server:
                k = args.clients_per_server
                same = {n: rows[n] for n in counts if k * n == args.clients}  # measured just now
                more = {n: same.get(n) or submits(pg, n, k * n, work, args) for n in counts}
                submits_table(more, f"{k} x N", args)
        if not args.no_agents:
            got = []
            for n in args.agents.split(","):
                got.append(agents_run(pg, int(n), work, args))
            agents_table(got, args)
        if not args.no_chaos:
            (work / "chaos").mkdir()
            with scratch(pg, "chaos") as url:
                print("\n" + run_chaos(issue_scenario(url), work / "chaos").line(), flush=True)


if __name__ == "__main__":
    main()
