"""API throughput and scheduling latency of a real gpufleet server.

Starts ``gpufleet server`` in a subprocess on a temp SQLite file (and on PostgreSQL when
GPUFLEET_TEST_DATABASE_URL is set: ALL ITS TABLES ARE DROPPED), registers a fleet
(50 nodes x 8 GPUs by default), then measures, each phase ``--runs`` times:

1. *baseline*: ``--clients`` connections call ``GET /v1/healthz`` back to back for
   ``--seconds`` (no auth, no body, no database; a sync handler). This is roughly the
   ceiling of the HTTP stack on this machine with these clients; ``vs healthz`` in the
   table is jobs/s divided by it, a figure that moves much less than the raw rate when
   the machine is shared or slower.
2. *sustained submissions*: the same clients ``POST /v1/jobs`` (1-GPU jobs) back to
   back for ``--seconds``. Every 201 is checked and means a committed job row and
   event row (SQLite WAL + synchronous=FULL; the server's group commit shares one
   fsync among concurrent submits). Latency is per request, client side.
3. *submit -> scheduled on an idle fleet*: submit one 1-GPU job, poll until SCHEDULED,
   cancel it, wait 50 ms (the loop goes idle), 20 times; the latency is taken from the
   job's own event rows (server clock). It runs before phase 2 fills the fleet.

The clients are ``--clients`` processes, one keep-alive HTTP/1.1 connection each,
started together at a common instant (process start-up is not measured). They share
the machine's cores with the server, so they are kept cheap: ``--client raw`` (the
default) writes a prepared request on a socket and parses status, Content-Length and
the JSON body (~0.1 ms CPU a request); ``--client httpx`` uses one ``httpx.Client``
each (~1.3 ms a request, more than the server spends). The table states the CPU the
clients and the server used during the measured window, as a share of all the
machine's cores (``os.cpu_count()``), and the server's CPU milliseconds per request
(``server ms/job``, ``ms/healthz``; the server's child processes included: its scheduling
loop runs in one): on a shared machine that figure moves far less
than the rates, which follow whatever else runs there. ``API ms/job`` is the API
process's part of ``server ms/job`` (the rest is the scheduling loop's): the API process
is one GIL, so 1 / that figure bounds jobs/s.

The table shows the median over runs of each figure (each run's p50/p99 are over all
its requests). Jobs accumulate across runs (the fleet fills, the queue grows), as on
a busy cluster.

With ``--tls`` every backend is measured twice, over plain HTTP and over HTTPS (a CA and
server certificate made by ``gpufleet ca init``; clients verify it, keep-alive
connections, so the handshake is outside the window), and a last line gives the TLS
rate as a share of the plain one.

    .venv/bin/python bench/bench_api.py [--seconds 5] [--runs 3] [--clients 8] [--client raw] [--tls]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

TOKEN = "gf_bench_admin_token"
JOB = {"command": ["python", "train.py"], "gpus": 1, "time_limit": "1h"}


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
    ca_file: str | None = None

    def cpu_s(self) -> tuple[float, float]:
        """User + system CPU seconds so far of the server process and of its children (the
        scheduling loop runs in a child process; Linux /proc)."""
        own = _cpu_s(self.proc.pid)
        kids = sum(_cpu_s(c) or 0.0 for c in _children(self.proc.pid))
        return (float("nan") if own is None else own), kids


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return out


def start(db_url: str, tls_dir: Path | None = None) -> Running:
    _gpufleet("db", "upgrade", "--database-url", db_url)
    port = _port()
    tls: list[str] = []
    ca_file = None
    if tls_dir is not None:
        _gpufleet("ca", "init", str(tls_dir), "--name", "127.0.0.1")
        tls = ["--tls-cert", str(tls_dir / "server.crt"), "--tls-key", str(tls_dir / "server.key")]
        ca_file = str(tls_dir / "ca.crt")
    # The clients are the admin: no request bucket (the default 100/s is a rate limit,
    # not what this bench measures; bench_flood.py measures the limits).
    args = ["server", "--port", str(port), "--database-url", db_url, "--rate-admin", "off", *tls]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args], env={**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN}
    )
    url = f"{'https' if tls_dir else 'http'}://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(url + "/v1/healthz", verify=_verify(ca_file)).status_code == 200:
                return Running(url=url, proc=proc, ca_file=ca_file)
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def _verify(ca_file: str | None) -> ssl.SSLContext | bool:
    return ssl.create_default_context(cafile=ca_file) if ca_file else True


def client(url: str, ca_file: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=url + "/v1",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
        verify=_verify(ca_file),
    )


def setup(url: str, *, nodes: int, gpus: int, ca_file: str | None = None) -> None:
    with client(url, ca_file) as c:
        c.post("/teams", json={"name": "bench"}).raise_for_status()
        c.post("/teams/bench/members", json={"user": "admin"}).raise_for_status()
        for n in range(nodes):
            spec = {"leaf": f"leaf-{n // 8}", "gpus": [{"index": i, "model": "H100"} for i in range(gpus)]}
            c.put(f"/nodes/node{n:03d}", json=spec).raise_for_status()


def idle_latency_ms(url: str, *, samples: int, ca_file: str | None = None) -> float:
    out: list[float] = []
    with client(url, ca_file) as c:
        for _ in range(samples):
            job = c.post("/jobs", json={"command": ["true"], "gpus": 1}).json()
            while (shown := c.get(f"/jobs/{job['id']}").json())["state"] == "PENDING":
                time.sleep(0.001)
            ev = {e["to_state"]: e["at"] for e in shown["events"]}
            out.append((ev["SCHEDULED"] - ev["PENDING"]) * 1000)
            c.post(f"/jobs/{job['id']}/cancel").raise_for_status()
            # Let the pass the cancel woke finish: the next job must find an idle loop. (A
            # pass already running when a job commits may pick it up with the ``now`` it
            # took before: the job would be "scheduled" before it was submitted.)
            time.sleep(0.05)
    return statistics.median(out)


# -- load generation ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    method: str
    path: str
    body: bytes
    status: int
    ca_file: str | None = None
    """Set: the server speaks HTTPS with a certificate from this CA."""


class RawConnection:
    """One keep-alive HTTP/1.1 connection that sends a prepared request: a few socket
    calls and a header scan per request, so the client costs little CPU."""

    def __init__(self, url: str, call: Call) -> None:
        where = urlsplit(url)
        sock = socket.create_connection((where.hostname, where.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if call.ca_file:
            sock = ssl.create_default_context(cafile=call.ca_file).wrap_socket(
                sock, server_hostname=where.hostname
            )
        self.sock = sock
        head = (
            f"{call.method} {call.path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(call.body)}\r\n\r\n"
        )
        self.request = head.encode() + call.body
        self.status = call.status
        self.buf = b""

    def once(self) -> None:
        self.sock.sendall(self.request)
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += self._recv()
        head = buf[:end].lower()
        status = int(head[9:12])
        at = head.index(b"content-length:") + 15
        nl = head.find(b"\r\n", at)
        length = int(head[at : nl if nl >= 0 else len(head)])
        buf = buf[end + 4 :]
        while len(buf) < length:
            buf += self._recv()
        body, self.buf = buf[:length], buf[length:]
        if status != self.status or not isinstance(json.loads(body), dict):
            raise SystemExit(f"{self.status} expected, got {status}: {body[:300]!r}")

    def _recv(self) -> bytes:
        got = self.sock.recv(65536)
        if not got:
            raise SystemExit("server closed the connection")
        return got

    def close(self) -> None:
        self.sock.close()


class HttpxConnection:
    def __init__(self, url: str, call: Call) -> None:
        self.client = client(url, call.ca_file)
        self.call = call

    def once(self) -> None:
        r = self.client.request(
            self.call.method,
            self.call.path.removeprefix("/v1"),
            content=self.call.body,
            headers={"Content-Type": "application/json"},
        )
        if r.status_code != self.call.status or not isinstance(r.json(), dict):
            raise SystemExit(f"{self.call.status} expected, got {r.status_code}: {r.text[:300]}")

    def close(self) -> None:
        self.client.close()


def _worker(url: str, call: Call, kind: str, begin: float, seconds: float) -> tuple[list[float], float]:
    """Requests back to back from ``begin`` (a time.time()) for ``seconds``: latencies and
    this process's CPU seconds over that window."""
    conn = RawConnection(url, call) if kind == "raw" else HttpxConnection(url, call)
    try:
        conn.once()  # connect and warm up outside the window
        time.sleep(max(0.0, begin - time.time()))
        cpu0 = time.process_time()
        end = time.perf_counter() + seconds
        lat: list[float] = []
        while (t0 := time.perf_counter()) < end:
            conn.once()
            lat.append(time.perf_counter() - t0)
        return lat, time.process_time() - cpu0
    finally:
        conn.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    rate: float
    p50_ms: float
    p99_ms: float
    client_cpu: float  # share of all cores
    server_cpu: float
    server_ms: float  # server CPU milliseconds per request
    api_ms: float  # of which the API process's (the rest: its children, the scheduling loop)


def load(srv: Running, call: Call, *, clients: int, seconds: float, kind: str) -> Load:
    with ProcessPoolExecutor(clients) as pool:
        begin = time.time() + 1.0 + 0.1 * clients
        futs = [pool.submit(_worker, srv.url, call, kind, begin, seconds) for _ in range(clients)]
        time.sleep(max(0.0, begin - time.time()))
        api0, kids0 = srv.cpu_s()
        time.sleep(seconds)
        api1, kids1 = srv.cpu_s()
        api_cpu, kids_cpu = api1 - api0, kids1 - kids0
        server_cpu = api_cpu + kids_cpu
        parts = [f.result() for f in futs]
    lat = sorted(x for p, _ in parts for x in p)
    cores = (os.cpu_count() or 1) * seconds
    return Load(
        rate=len(lat) / seconds,
        p50_ms=lat[len(lat) // 2] * 1000,
        p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
        client_cpu=sum(cpu for _, cpu in parts) / cores,
        server_cpu=server_cpu / cores,
        server_ms=server_cpu * 1000 / max(1, len(lat)),
        api_ms=api_cpu * 1000 / max(1, len(lat)),
    )


def bench(name: str, db_url: str, args: argparse.Namespace, tls_dir: Path | None = None) -> list[str]:
    srv = start(db_url, tls_dir)
    ca = srv.ca_file
    health = Call(method="GET", path="/v1/healthz", body=b"", status=200, ca_file=ca)
    submit = Call(method="POST", path="/v1/jobs", body=json.dumps(JOB).encode(), status=201, ca_file=ca)
    opts = {"clients": args.clients, "seconds": args.seconds, "kind": args.client}
    try:
        setup(srv.url, nodes=args.nodes, gpus=args.gpus, ca_file=ca)
        idle = [idle_latency_ms(srv.url, samples=20, ca_file=ca) for _ in range(args.runs)]
        base: list[Load] = []
        jobs: list[Load] = []
        for _ in range(args.runs):
            base.append(load(srv, health, **opts))
            jobs.append(load(srv, submit, **opts))
    finally:
        srv.proc.terminate()
        srv.proc.wait(10)

    def med(xs: list[Load], attr: str) -> float:
        return statistics.median(getattr(x, attr) for x in xs)

    ratio = statistics.median(j.rate / b.rate for j, b in zip(jobs, base, strict=True))
    return [
        name,
        f"{med(jobs, 'rate'):.0f}",
        f"{med(jobs, 'p50_ms'):.1f}",
        f"{med(jobs, 'p99_ms'):.1f}",
        f"{statistics.median(idle):.1f}",
        f"{med(base, 'rate'):.0f}",
        f"{ratio:.2f}",
        f"{med(jobs, 'client_cpu'):.0%}",
        f"{med(jobs, 'server_cpu'):.0%}",
        f"{med(jobs, 'server_ms'):.2f}",
        f"{med(jobs, 'api_ms'):.2f}",
        f"{med(base, 'server_ms'):.2f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw")
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    ap.add_argument("--tls", action="store_true", help="Each backend over HTTP and over HTTPS.")
    args = ap.parse_args()
    rows = [
        [
            "backend",
            "jobs/s",
            "p50 ms",
            "p99 ms",
            "submit->sched ms",
            "healthz/s",
            "vs healthz",
            "client CPU",
            "server CPU",
            "server ms/job",
            "API ms/job",
            "ms/healthz",
        ]
    ]
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(bench("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", args))
        if args.tls:
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(
                    bench("sqlite+tls", f"sqlite:///{Path(tmp) / 'bench.db'}", args, Path(tmp) / "pki")
                )
    pg = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if pg:
        from sqlalchemy import MetaData, create_engine

        engine = create_engine(pg)
        meta = MetaData()
        meta.reflect(engine)
        meta.drop_all(engine)
        engine.dispose()
        rows.append(bench("postgresql", pg, args))
        if args.tls:
            meta = MetaData()
            meta.reflect(engine)
            meta.drop_all(engine)
            engine.dispose()
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(bench("postgresql+tls", pg, args, Path(tmp) / "pki"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(
        f"{args.clients} {args.client} clients x {args.seconds:g}s, {args.runs} runs (medians), "
        f"fleet {args.nodes}x{args.gpus}, {os.cpu_count()} cores shared by clients and server "
        "(CPU columns: share of all cores)"
    )
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    rates = {r[0]: float(r[1]) for r in rows[1:]}
    for name, rate in rates.items():
        if name.endswith("+tls") and rates.get(name.removesuffix("+tls")):
            plain = rates[name.removesuffix("+tls")]
            print(f"TLS {name}: {rate / plain:.0%} of the plain rate ({rate:.0f} vs {plain:.0f} jobs/s)")


if __name__ == "__main__":
    main()
