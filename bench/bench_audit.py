"""What the audit log costs: the same server with and without ``AuditMiddleware``.

Two phases per backend, each ``--runs`` times, with the audit log on and off (the
middleware taken out of the app; nothing else differs):

1. *submissions*: ``--clients`` connections ``POST /v1/jobs`` back to back for
   ``--seconds`` (bench_api's raw clients). A submission's audit row is not waited for:
   rows are gathered for ``audit.DELAY_S`` and join a group commit.
2. *cancels, one client*: ``POST /v1/jobs/{id}/cancel`` of pending jobs one at a time. A
   request that changed state other than a submission gets its reply only once its
   audit row is committed (one more group commit, so one more fsync on SQLite): this is
   the price of that rule, on an idle server where no batch is shared.

Both servers (audit on, audit off; each its own database) run at once and each run
measures one, then the other. Rate limits are off (the bench is one admin token); the
scheduling loop runs as in ``gpufleet server`` (a child process). The table shows
medians over runs. With GPUFLEET_TEST_DATABASE_URL set, PostgreSQL too, in two databases
made next to that one (``gpufleet_bench_audit_false/true``: ALL THEIR TABLES ARE DROPPED).

    .venv/bin/python bench/bench_audit.py [--seconds 5] [--runs 3] [--clients 8] [--cancels 200]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_api import JOB, TOKEN, Call, Load, Running, client, load

LAUNCH = """
import sys, uvicorn
from gpufleet.server.app import create_app
from gpufleet.server.http.audit import AuditMiddleware
from gpufleet.server.config import ServerConfig
from gpufleet.ratelimit import RateLimits
url, port, audit, token = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "on", sys.argv[4]
off = RateLimits(user=None, operator=None, admin=None, auth_failures=None)
app = create_app(ServerConfig(database_url=url, admin_token=token, scheduler_process=True, rates=off))
if not audit:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not AuditMiddleware]
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(db_url: str, *, audit: bool) -> Running:
    subprocess.run([sys.executable, "-m", "gpufleet", "db", "upgrade", "--database-url", db_url], check=True)
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, db_url, str(port), "on" if audit else "off", TOKEN],
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


def cancel_ms(url: str, *, n: int) -> float:
    """Median latency of cancelling a pending job (a pool without nodes: none starts)."""
    out: list[float] = []
    with client(url) as c:
        ids = [c.post("/jobs", json=JOB | {"pool": "empty"}).json()["id"] for _ in range(n)]
        for jid in ids:
            t0 = time.perf_counter()
            c.post(f"/jobs/{jid}/cancel").raise_for_status()
            out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def prepare(url: str) -> None:
    with client(url) as c:
        c.post("/teams", json={"name": "bench"}).raise_for_status()
        c.post("/teams/bench/members", json={"user": "admin"}).raise_for_status()
        c.post("/pools", json={"name": "empty"}).raise_for_status()


def postgres(url: str, name: str) -> str:
    """A database ``name`` next to ``url``'s, created if missing, ALL ITS TABLES DROPPED."""
    from sqlalchemy import MetaData, create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        if c.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first() is None:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    own = make_url(url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(own)
    meta = MetaData()
    meta.reflect(engine)
    meta.drop_all(engine)
    engine.dispose()
    return own


def bench(urls: dict[bool, str], args: argparse.Namespace) -> dict[bool, tuple[list[Load], list[float]]]:
    """Both servers up at once; each run measures one, then the other (so a machine that
    gets busier during the bench does not favour either)."""
    servers = {audit: start(url, audit=audit) for audit, url in urls.items()}
    submit = Call(
        method="POST", path="/v1/jobs", body=json.dumps(JOB | {"pool": "empty"}).encode(), status=201
    )
    out: dict[bool, tuple[list[Load], list[float]]] = {audit: ([], []) for audit in servers}
    try:
        for srv in servers.values():
            prepare(srv.url)
        for _ in range(args.runs):
            for audit, srv in servers.items():
                out[audit][1].append(cancel_ms(srv.url, n=args.cancels))
                out[audit][0].append(
                    load(srv, submit, clients=args.clients, seconds=args.seconds, kind="raw")
                )
    finally:
        for srv in servers.values():
            srv.proc.terminate()
            srv.proc.wait(10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--cancels", type=int, default=200)
    args = ap.parse_args()
    rows = [["backend", "audit", "jobs/s", "p50 ms", "p99 ms", "API ms/job", "cancel p50 ms"]]
    with tempfile.TemporaryDirectory() as tmp:
        backends = [
            ("sqlite", {audit: f"sqlite:///{Path(tmp) / f'bench-{audit}.db'}" for audit in (False, True)})
        ]
        if pg := os.environ.get("GPUFLEET_TEST_DATABASE_URL"):
            backends.append(
                ("postgresql", {a: postgres(pg, f"gpufleet_bench_audit_{a}".lower()) for a in (False, True)})
            )
        for name, urls in backends:
            for audit, (jobs, cancels) in bench(urls, args).items():

                def med(attr: str, jobs: list[Load] = jobs) -> float:
                    return statistics.median(getattr(j, attr) for j in jobs)

                rows.append(
                    [
                        name,
                        "on" if audit else "off",
                        f"{med('rate'):.0f}",
                        f"{med('p50_ms'):.1f}",
                        f"{med('p99_ms'):.1f}",
                        f"{med('api_ms'):.2f}",
                        f"{statistics.median(cancels):.1f}",
                    ]
                )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(
        f"{args.clients} raw clients x {args.seconds:g}s submitting, {args.runs} runs (medians); "
        f"{args.cancels} cancels one at a time; {os.cpu_count()} cores shared by clients and server"
    )
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
