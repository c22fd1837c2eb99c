"""API throughput and scheduling latency of a real gpufleet server.

Starts ``gpufleet server`` in a subprocess on a temp SQLite file (and on PostgreSQL when
GPUFLEET_TEST_DATABASE_URL is set: ALL ITS TABLES ARE DROPPED), registers a fleet
(50 nodes x 8 GPUs by default), then:

1. submit -> scheduled on an idle fleet: submit one 1-GPU job, wait until SCHEDULED,
   cancel it; the latency is taken from the job's own event rows (server clock).
2. sustained submissions: ``--clients`` processes (one keep-alive httpx client each)
   submit 1-GPU jobs back to back for ``--seconds``; every 201 is a committed job.

Each phase is repeated ``--runs`` times; the table shows medians over runs.

    .venv/bin/python bench/bench_api.py [--seconds 5] [--runs 3] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

TOKEN = "gf_bench_admin_token"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpufleet(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gpufleet", *args], check=True, capture_output=True)


@dataclass
class Running:
    url: str
    proc: subprocess.Popen[bytes]


def start(db_url: str) -> Running:
    _gpufleet("db", "upgrade", "--database-url", db_url)
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db_url],
        env={**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(url + "/v1/healthz").status_code == 200:
                return Running(url=url, proc=proc)
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


def setup(url: str, *, nodes: int, gpus: int) -> None:
    with client(url) as c:
        c.post("/teams", json={"name": "bench"}).raise_for_status()
        c.post("/teams/bench/members", json={"user": "admin"}).raise_for_status()
        for n in range(nodes):
            spec = {"leaf": f"leaf-{n // 8}", "gpus": [{"index": i, "model": "H100"} for i in range(gpus)]}
            c.put(f"/nodes/node{n:03d}", json=spec).raise_for_status()


def idle_latency_ms(url: str, *, samples: int) -> float:
    out: list[float] = []
    with client(url) as c:
        for _ in range(samples):
            job = c.post("/jobs", json={"command": ["true"], "gpus": 1}).json()
            while (shown := c.get(f"/jobs/{job['id']}").json())["state"] == "PENDING":
                time.sleep(0.001)
            ev = {e["to_state"]: e["at"] for e in shown["events"]}
            out.append((ev["SCHEDULED"] - ev["PENDING"]) * 1000)
            c.post(f"/jobs/{job['id']}/cancel").raise_for_status()
    return statistics.median(out)


def _submitter(url: str, seconds: float) -> list[float]:
    lat: list[float] = []
    spec = {"command": ["python", "train.py"], "gpus": 1, "time_limit": "1h"}
    with client(url) as c:
        end = time.perf_counter() + seconds
        while (t0 := time.perf_counter()) < end:
            r = c.post("/jobs", json=spec)
            if r.status_code != 201:
                raise SystemExit(f"submit failed: {r.status_code} {r.text}")
            lat.append(time.perf_counter() - t0)
    return lat


def throughput(url: str, *, clients: int, seconds: float) -> tuple[float, float, float]:
    with ProcessPoolExecutor(clients) as pool:
        t0 = time.perf_counter()
        parts = list(pool.map(_submitter, [url] * clients, [seconds] * clients))
        wall = time.perf_counter() - t0
    lat = sorted(x for p in parts for x in p)
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    return len(lat) / wall, p50, p99


def bench(name: str, db_url: str, args: argparse.Namespace) -> list[str]:
    srv = start(db_url)
    try:
        setup(srv.url, nodes=args.nodes, gpus=args.gpus)
        idle = [idle_latency_ms(srv.url, samples=20) for _ in range(args.runs)]
        rates = [throughput(srv.url, clients=args.clients, seconds=args.seconds) for _ in range(args.runs)]
    finally:
        srv.proc.terminate()
        srv.proc.wait(10)
    med = [statistics.median(r[i] for r in rates) for i in range(3)]
    return [name, f"{med[0]:.0f}", f"{med[1]:.1f}", f"{med[2]:.1f}", f"{statistics.median(idle):.1f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    rows = [["backend", "jobs/s", "p50 ms", "p99 ms", "submit->scheduled ms (idle)"]]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(bench("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", args))
    pg = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if pg:
        from sqlalchemy import MetaData, create_engine

        engine = create_engine(pg)
        meta = MetaData()
        meta.reflect(engine)
        meta.drop_all(engine)
        engine.dispose()
        rows.append(bench("postgresql", pg, args))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(
        f"{args.clients} clients x {args.seconds:g}s, {args.runs} runs (medians), "
        f"fleet {args.nodes}x{args.gpus}"
    )
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
