"""One user floods the API: do agent syncs and other users still get answered?

Starts ``gpufleet server`` (subprocess, temp SQLite, its default limits unless
``--server-args`` says otherwise) once per run, with ``--agents`` simulated agents (8
simulated GPUs each, node credentials from join tokens) syncing every ``--interval``
seconds, and one other user making a light mix of calls (``--other-rate`` a second:
whoami, a 20-job list page, a submit, a job), both for the whole run. Then, after
``--warmup`` seconds (registration):

1. *quiet* for ``--seconds``: nothing else;
2. *submit flood* for ``--seconds``: the flooding user's ``--clients`` connections
   ``POST /v1/jobs`` back to back (1-GPU jobs into a pool with no nodes, so the
   agents' work does not change);
3. a ``--gap`` to settle;
4. *list flood* for ``--seconds``: the same connections ``GET /v1/jobs?limit=1000``
   back to back (the flooding user owns ``--seed-jobs`` jobs, written into the
   database before the server starts, so every page is full).

Per phase: agent sync latency (client side: p50, p99, and syncs that failed), the most
nodes NotReady at any time (sampled every second from ``/v1/fleet/summary``), the
flooding user's answers (2xx, 429, other), and the other user's p99. Goals during a
flood: sync p99 <= 100 ms, no NotReady node, the other user's p99 within 2x of quiet.
The table shows the median over ``--runs`` of each figure, and the ratios of the flood
phases' p99s to the quiet phase's of the same run (median of those ratios).

The flood clients are one process of asyncio connections writing prepared requests on
raw sockets (cheap: the machine's cores are shared with the server); agents and the
other user are httpx clients in their own processes. ``--src DIR`` runs the server (and
the seeding) from another checkout's ``src`` (a before/after comparison).

    .venv/bin/python bench/bench_flood.py [--seconds 30] [--runs 3] [--clients 16]
    .venv/bin/python bench/bench_flood.py --seconds 5 --runs 1 --warmup 4 --gap 2   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

TOKEN = "gf_bench_flood_admin"
FLOOD_POOL = "flood"
JOB = {"command": ["true"], "gpus": 1, "pool": FLOOD_POOL, "team": "bench"}
PHASES = ("quiet", "submit flood", "list flood")
Sample = tuple[float, float, int]  # started at (wall), latency (s; inf: no answer), status


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(src: str | None) -> dict[str, str]:
    env = {**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN}
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


# -- seeding (a subprocess: the server's own code, before the server starts) -------------------


def seed(db_url: str, jobs_n: int) -> dict[str, str]:
    """Admin, team ``bench``, the node-less pool, two users (the flooder owns ``jobs_n``
    pending jobs); returns the users' tokens. Written with the service functions, so
    the seeding does not pass through (and is not slowed by) the API's limits."""
    from sqlalchemy import select

    from gpufleet.api.jobs import JobSubmit
    from gpufleet.api.users import PoolIn, UserIn
    from gpufleet.server.problems import Failure
    from gpufleet.server.services import auth, pools, submissions, users
    from gpufleet.server.services.inventory import FleetCache
    from gpufleet.server.services.submitbatch import NewJob
    from gpufleet.server.store.db import Database
    from gpufleet.server.store.models import User

    db = Database.connect(db_url)
    now = time.time()
    users.bootstrap_admin(db=db, now=now, token=TOKEN)
    with db.read() as s:
        admin_id = s.scalar(select(User.id).where(User.name == "admin"))
    assert admin_id is not None
    admin = auth.Principal(user_id=admin_id, name="admin", role="admin")
    users.create_team(db=db, actor=admin, name="bench")
    users.add_member(db=db, actor=admin, team="bench", user="admin")
    pools.create_pool(db=db, actor=admin, spec=PoolIn(name=FLOOD_POOL, gpu=True))
    tokens = {}
    for name in ("flooder", "other"):
        made = users.create_user(
            db=db, actor=admin, spec=UserIn(name=name, role="user", teams=["bench"]), now=now
        )
        assert not isinstance(made, Failure), made
        tokens[name] = made.token
        if name == "flooder":
            who = auth.Principal(user_id=made.id, name=name, role="user")
            spec = JobSubmit.model_validate(JOB)
            fleets = FleetCache()
            for start in range(0, jobs_n, 500):
                batch = [
                    NewJob(actor=who, spec=spec, time_limit_s=None, now=now, fleets=fleets)
                    for _ in range(min(500, jobs_n - start))
                ]
                with db.write() as s:
                    submissions.insert_jobs(s, batch)
    db.dispose()
    return tokens


# -- the server -------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str]


def start_server(tmp: Path, args: argparse.Namespace) -> Server:
    db_url = f"sqlite:///{tmp / 'bench.db'}"
    env = _env(args.src)
    gf = [sys.executable, "-m", "gpufleet"]
    subprocess.run([*gf, "db", "upgrade", "--database-url", db_url], check=True, capture_output=True, env=env)
    out = subprocess.run(
        [sys.executable, __file__, "--seed", db_url, "--seed-jobs", str(args.seed_jobs)],
        check=True,
        capture_output=True,
        env=env,
        text=True,
    )
    tokens = json.loads(out.stdout.strip().splitlines()[-1])
    port = _port()
    extra = args.server_args.split() if args.server_args else []
    proc = subprocess.Popen([*gf, "server", "--port", str(port), "--database-url", db_url, *extra], env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(url + "/v1/healthz", timeout=1).status_code == 200:
                return Server(url=url, port=port, proc=proc, tokens=tokens)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def join_tokens(url: str, names: list[str]) -> dict[str, str]:
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        return {n: c.post("/nodes/join-tokens", json={"node": n}).json()["token"] for n in names}


# -- load: agents, the other user, the flood (each its own process) ----------------------------


def agents(url: str, creds: dict[str, str], interval: float, until: float, work: str) -> list[Sample]:
    """Simulated agents (the real ``Agent.build_sync`` / ``apply``), one asyncio task each,
    each syncing with its own node credential every ``interval`` (random phase)."""
    from gpufleet.agent import Agent, AgentConfig, SimSpec, SimulatedProbe, make_agent

    class _Unused:
        def sync(self, node: str, body: dict[str, object]) -> dict[str, object]:
            raise AssertionError("the bench drives the HTTP itself")

        def close(self) -> None:
            pass

    out: list[Sample] = []

    async def one(c: httpx.AsyncClient, agent: Agent, token: str) -> None:
        await asyncio.sleep(random.uniform(0, interval))
        headers = {"Authorization": f"Bearer {token}"}
        while time.time() < until:
            t_start = time.time()
            agent.tick()
            body = agent.build_sync()
            t0 = time.perf_counter()
            try:
                resp = await c.post(f"/nodes/{agent.config.node}/sync", json=body, headers=headers)
                out.append((t_start, time.perf_counter() - t0, resp.status_code))
                if resp.status_code == 200:
                    agent.apply(resp.json(), sent=body)
            except httpx.HTTPError:
                out.append((t_start, float("inf"), 0))
            await asyncio.sleep(max(0.0, interval - (time.time() - t_start)))

    async def main() -> None:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=url + "/v1", timeout=60, limits=limits) as c:
            tasks = []
            for i, (name, token) in enumerate(sorted(creds.items())):
                config = AgentConfig(node=name, work_dir=Path(work) / name, leaf=f"leaf-{i // 10}")
                agent = make_agent(
                    config=config, probe=SimulatedProbe(node=name, spec=SimSpec(gpus=8)), transport=_Unused()
                )
                tasks.append(one(c, agent, token))
            await asyncio.gather(*tasks)

    asyncio.run(main())
    return out


def other_user(url: str, token: str, rate: float, until: float) -> list[Sample]:
    """A user who is not flooding: whoami, a small list page, a submit, a show, in turn."""
    out: list[Sample] = []
    last_job = [0]

    async def main() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url + "/v1", headers=headers, timeout=60) as c:
            calls = [
                lambda: c.get("/users/me"),
                lambda: c.get("/jobs", params={"limit": 20}),
                lambda: c.post("/jobs", json=JOB),
                lambda: c.get(f"/jobs/{last_job[0]}") if last_job[0] else c.get("/users/me"),
            ]
            i = 0
            while time.time() < until:
                t_start = time.time()
                t0 = time.perf_counter()
                try:
                    resp = await calls[i % len(calls)]()
                    out.append((t_start, time.perf_counter() - t0, resp.status_code))
                    if resp.status_code == 201:
                        last_job[0] = int(resp.json()["id"])
                except httpx.HTTPError:
                    out.append((t_start, float("inf"), 0))
                i += 1
                await asyncio.sleep(max(0.0, 1.0 / rate - (time.time() - t_start)))

    asyncio.run(main())
    return out


def flood(port: int, token: str, clients: int, windows: list[tuple[str, float, float]]) -> list[Sample]:
    """``clients`` keep-alive connections sending the prepared request of each window
    back to back (a new connection when the server closes one)."""
    body = json.dumps(JOB).encode()
    auth = f"Authorization: Bearer {token}\r\nHost: 127.0.0.1\r\n"
    requests = {
        "submit": (
            f"POST /v1/jobs HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
        "list": f"GET /v1/jobs?limit=1000 HTTP/1.1\r\n{auth}\r\n".encode(),
    }
    out: list[Sample] = []

    async def client(req: bytes, until: float) -> None:
        reader = writer = None
        while time.time() < until:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            t_start, t0 = time.time(), time.perf_counter()
            try:
                writer.write(req)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                out.append((t_start, time.perf_counter() - t0, status))
                if b"connection: close" in head.lower():
                    writer.close()
                    writer = None
            except (OSError, asyncio.IncompleteReadError):
                out.append((t_start, float("inf"), 0))
                writer = None
        if writer is not None:
            writer.close()

    async def main() -> None:
        for kind, start, end in windows:
            await asyncio.sleep(max(0.0, start - time.time()))
            await asyncio.gather(*(client(requests[kind], end) for _ in range(clients)))

    asyncio.run(main())
    return out


def watch_not_ready(url: str, until: float, out: list[tuple[float, int]]) -> None:
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        while time.time() < until:
            t = time.time()
            try:
                s = c.get("/fleet/summary").json()
                out.append((t, int(s["nodes"]) - int(s["nodes_ready"])))
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(max(0.0, 1.0 - (time.time() - t)))


# -- one run, and the table -----------------------------------------------------------------


def p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(0.99 * (len(xs) - 1) + 0.5))]


def p50(xs: list[float]) -> float:
    return 1000 * statistics.median(xs) if xs else float("nan")


@dataclass
class Phase:
    sync_p50: float
    sync_p99: float
    sync_failed: int
    not_ready: int
    flood_ok: int
    flood_429: int
    flood_other: int
    other_p99: float
    other_failed: int


def _in(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return [x for x in samples if start <= x[0] < end]


def run_once(args: argparse.Namespace) -> dict[str, Phase]:
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp), args)
        try:
            names = [f"flood-{i:03d}" for i in range(args.agents)]
            creds = join_tokens(srv.url, names)
            t0 = time.time() + 3.0  # workers' start-up
            start = t0 + args.warmup
            windows = {
                "quiet": (start, start + args.seconds),
                "submit flood": (start + args.seconds, start + 2 * args.seconds),
                "list flood": (start + 2 * args.seconds + args.gap, start + 3 * args.seconds + args.gap),
            }
            until = windows["list flood"][1] + 1.0
            spawn = multiprocessing.get_context("spawn")
            not_ready: list[tuple[float, int]] = []
            watcher = threading.Thread(target=watch_not_ready, args=(srv.url, until, not_ready), daemon=True)
            with ProcessPoolExecutor(3, mp_context=spawn) as pool:
                futs: dict[str, Future[list[Sample]]] = {
                    "agents": pool.submit(agents, srv.url, creds, args.interval, until, f"{tmp}/agents"),
                    "other": pool.submit(other_user, srv.url, srv.tokens["other"], args.other_rate, until),
                    "flood": pool.submit(
                        flood,
                        srv.port,
                        srv.tokens["flooder"],
                        args.clients,
                        [("submit", *windows["submit flood"]), ("list", *windows["list flood"])],
                    ),
                }
                watcher.start()
                got = {k: f.result() for k, f in futs.items()}
            watcher.join()
        finally:
            srv.proc.terminate()
            srv.proc.wait(timeout=30)
    out = {}
    for phase, (a, b) in windows.items():
        syncs = _in(got["agents"], a, b)
        flood_s = _in(got["flood"], a, b)
        other = _in(got["other"], a, b)
        out[phase] = Phase(
            sync_p50=p50([x[1] for x in syncs if x[2] == 200]),
            sync_p99=p99([x[1] for x in syncs]),
            sync_failed=sum(1 for x in syncs if x[2] != 200),
            not_ready=max((n for t, n in not_ready if a <= t < b), default=-1),
            flood_ok=sum(1 for x in flood_s if 200 <= x[2] < 300),
            flood_429=sum(1 for x in flood_s if x[2] == 429),
            flood_other=sum(1 for x in flood_s if not (200 <= x[2] < 300 or x[2] == 429)),
            other_p99=p99([x[1] for x in other]),
            other_failed=sum(1 for x in other if not 200 <= x[2] < 300),
        )
    return out


def med(xs: list[float]) -> float:
    good = [x for x in xs if x == x]  # drop NaN
    return statistics.median(good) if good else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--interval", type=float, default=1.0, help="agent sync interval (s)")
    ap.add_argument("--other-rate", type=float, default=5.0, help="the other user's calls a second")
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--gap", type=float, default=5.0, help="pause between the two floods (s)")
    ap.add_argument("--seed-jobs", type=int, default=2000)
    ap.add_argument("--server-args", default="", help="extra `gpufleet server` options")
    ap.add_argument("--src", help="run the server from this src directory (another checkout)")
    ap.add_argument("--seed", metavar="DB_URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seed:
        print(json.dumps(seed(args.seed, args.seed_jobs)))
        return
    print(
        f"machine: {os.cpu_count()} CPUs; {args.agents} agents syncing every {args.interval:g}s; "
        f"{args.clients} flood clients; phases of {args.seconds:g}s; median of {args.runs} runs"
        + (f"; server: {args.server_args}" if args.server_args else "")
        + (f"; src: {args.src}" if args.src else "")
    )
    runs = [run_once(args) for _ in range(args.runs)]
    cols = ("phase", "sync p50", "sync p99", "x quiet", "failed", "NotReady", "flood 2xx", "flood 429")
    cols += ("flood oth", "other p99", "x quiet", "oth fail")
    print("  ".join(f"{c:>12}" for c in cols))
    for phase in PHASES:
        got = [r[phase] for r in runs]
        sync_x = med([r[phase].sync_p99 / r["quiet"].sync_p99 for r in runs])
        other_x = med([r[phase].other_p99 / r["quiet"].other_p99 for r in runs])
        row = (
            phase,
            f"{med([g.sync_p50 for g in got]):.1f}ms",
            f"{med([g.sync_p99 for g in got]):.1f}ms",
            f"{sync_x:.2f}",
            f"{med([g.sync_failed for g in got]):g}",
            f"{med([g.not_ready for g in got]):g}",
            f"{med([g.flood_ok for g in got]):g}",
            f"{med([g.flood_429 for g in got]):g}",
            f"{med([g.flood_other for g in got]):g}",
            f"{med([g.other_p99 for g in got]):.1f}ms",
            f"{other_x:.2f}",
            f"{med([g.other_failed for g in got]):g}",
        )
        print("  ".join(f"{v:>12}" for v in row), flush=True)
    floods = [r[p] for r in runs for p in PHASES[1:]]
    quiet_other = med([r["quiet"].other_p99 for r in runs])
    goals = (
        ("sync p99 <= 100 ms during the floods", all(f.sync_p99 <= 100 for f in floods)),
        ("no NotReady node", all(f.not_ready <= 0 for f in floods)),
        ("other user's p99 within 2x of quiet", all(f.other_p99 <= 2 * quiet_other for f in floods)),
    )
    for what, met in goals:
        print(f"goal: {what}: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
