"""Throughput and added latency of one ``gpufleet gateway`` process, against going
straight to the replicas and against nginx in front of the same replicas.

Starts ``--replicas`` upstream replicas (each a process: uvicorn + httptools + uvloop,
a raw ASGI app answering a 40-byte JSON), then measures three targets, each
``--runs`` times (the order rotates between runs):

* *direct*: the load generator's connections spread round robin over the replicas
  (the baseline: no proxy at all);
* *gateway*: ``gpufleet gateway --endpoints-file`` (one process), ``/s/bench/`` with a
  service token (auth, request id, balancing, metrics: the whole path);
* *nginx*: ``/usr/sbin/nginx``, one worker, ``least_conn`` upstream with ``keepalive
  64`` (skipped when nginx is not installed).

For each: *saturation* (``--concurrency`` keep-alive connections back to back for
``--seconds``: requests/s) and *fixed rate* (``--rate`` requests/s spread evenly for
``--seconds``, over a pool of connections: p50/p99 latency, from the moment a request is
written to its last byte; at this rate nothing queues, so the time a request waits
for the load generator's timer is not counted). ``added`` is the target's figure minus
direct's of the same run; ``CPU us/req`` is the proxy's CPU time (its processes') per request
during the saturation window (psutil), the figure that moves least when the machine
is busy with something else.

The load generator is one process (this one) on uvloop: ``--client raw`` (default)
writes prepared requests on sockets and parses status and Content-Length (~25 us of
CPU a request); ``--client aiohttp`` uses an aiohttp ClientSession (~4x that): on a
two-core machine the generator shares the cores with the proxy and the replicas, so
a heavier one lowers every saturation figure. The table shows medians over runs.

    .venv/bin/python bench/bench_gateway.py [--seconds 5] [--runs 3] [--replicas 2] [--concurrency 32]
    .venv/bin/python bench/bench_gateway.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

TOKEN = "gf_bench_service_token_0123456789"
NGINX = "/usr/sbin/nginx"
GOAL_RPS = 2000.0
GOAL_ADDED_P99_MS = 5.0


# -- the upstream replica (run as: bench_gateway.py --upstream PORT) ------------------------


def serve_upstream(port: int) -> None:
    import uvicorn

    body = b'{"ok":true,"port":%d,"text":"hello"}' % port
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    done = {"type": "http.response.body", "body": body}

    async def app(scope: dict[str, object], receive: Callable[[], Awaitable[object]], send: Callable) -> None:  # type: ignore[type-arg]
        if scope["type"] == "http":
            await send(start)
            await send(done)

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", lifespan="off",
                access_log=False, log_level="warning")  # fmt: skip


# -- the load generator ------------------------------------------------------------------


class RawConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self) -> None:
        self.buf = b""
        self.waiter: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        i = head.find(b"content-length:")
        if i < 0:
            raise RuntimeError(f"no content-length in {head!r}")
        j = head.find(b"\r\n", i)
        length = int(head[i + 15 : j if j >= 0 else len(head)])
        if len(self.buf) >= end + 4 + length:
            status = int(self.buf[9:12])
            self.buf = self.buf[end + 4 + length :]
            assert self.waiter is not None
            self.waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed"))

    async def request(self, raw: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(raw)
        return await self.waiter


@dataclass(frozen=True)
class Target:
    name: str
    bases: list[tuple[int, str]]
    """(port, path prefix) per connection slot, round robin."""
    headers: str = ""


def raw_request(port: int, path: str, headers: str) -> bytes:
    return f"GET {path}v1/ping HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}\r\n".encode()


async def _open(target: Target, n: int, client: str) -> list[Callable[[], Awaitable[int]]]:
    """``n`` request functions, each on its own connection."""
    loop = asyncio.get_running_loop()
    out: list[Callable[[], Awaitable[int]]] = []
    if client == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False))
        hdrs = dict(h.split(": ", 1) for h in target.headers.splitlines() if h)
        for i in range(n):
            port, path = target.bases[i % len(target.bases)]
            url = f"http://127.0.0.1:{port}{path}v1/ping"

            async def go(url: str = url) -> int:
                async with session.get(url, headers=hdrs) as r:
                    await r.read()
                    return r.status

            out.append(go)
        return out
    for i in range(n):
        port, path = target.bases[i % len(target.bases)]
        _, conn = await loop.create_connection(RawConn, "127.0.0.1", port)
        conn.transport.set_write_buffer_limits(0)  # type: ignore[union-attr]
        out.append(lambda c=conn, raw=raw_request(port, path, target.headers): c.request(raw))
    return out


async def saturate(
    target: Target, conns: int, seconds: float, client: str, pid: int | None
) -> tuple[float, float]:
    """(requests/s, proxy CPU us per request) with ``conns`` connections back to back."""
    fns = await _open(target, conns, client)
    stop = 0.0
    counts = [0]

    async def worker(fn: Callable[[], Awaitable[int]]) -> None:
        while time.perf_counter() < stop:
            if await fn() != 200:
                raise RuntimeError(f"{target.name}: non-200")
            counts[0] += 1

    stop = time.perf_counter() + min(1.0, seconds / 3)  # warm-up
    await asyncio.gather(*(worker(f) for f in fns))
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)] if pid else []

    def cpu_s() -> float:  # nginx: its master and worker
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    cpu0 = cpu_s()
    counts[0] = 0
    t0 = time.perf_counter()
    stop = t0 + seconds
    await asyncio.gather(*(worker(f) for f in fns))
    elapsed = time.perf_counter() - t0
    cpu = cpu_s() - cpu0 if procs else float("nan")
    return counts[0] / elapsed, 1e6 * cpu / max(1, counts[0])


async def fixed_rate(target: Target, rate: float, seconds: float, client: str) -> tuple[float, float]:
    """(p50, p99) ms at ``rate`` requests/s."""
    pool: asyncio.Queue[Callable[[], Awaitable[int]]] = asyncio.Queue()
    for fn in await _open(target, 64, client):
        pool.put_nowait(fn)
    lat: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        fn = await pool.get()
        t = time.perf_counter()
        status = await fn()
        lat.append(time.perf_counter() - t)
        pool.put_nowait(fn)
        if status != 200:
            raise RuntimeError(f"{target.name}: {status}")

    t0 = time.perf_counter()
    total = int(rate * seconds)
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - t0) * rate) + 1)
        while sent < due:
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    q = statistics.quantiles(lat, n=100)
    return 1000 * statistics.median(lat), 1000 * q[98]


# -- the processes -------------------------------------------------------------------------


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited ({proc.returncode})")
        try:
            if httpx.get(url, headers=headers, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}: not up after 30 s")


def start_nginx(tmp: Path, ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    port = _port()
    servers = "\n".join(f"    server 127.0.0.1:{p};" for p in ports)
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(f"""{user}daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 10000000;  # the default (1000) closes the load generator's connections
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream replicas {{
    least_conn;
{servers}
    keepalive 64;
    keepalive_requests 10000000;
  }}
  server {{
    listen 127.0.0.1:{port};
    location /s/bench/ {{
      proxy_pass http://replicas/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
""")
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp)], stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/s/bench/v1/ping", proc)
    return proc, port


def start_gateway(tmp: Path, ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    feed = {
        "at": time.time(),
        "services": [
            {
                "name": "bench",
                "protocol": "http",
                "tokens": [hashlib.sha256(TOKEN.encode()).hexdigest()],
                "rate": None,
                "endpoints": [
                    {
                        "id": f"1.{i}",
                        "job_id": 1,
                        "replica": i,
                        "url": f"http://127.0.0.1:{p}",
                        "node": "local",
                        "generation": 1,
                        "gpu_util": None,
                    }
                    for i, p in enumerate(ports)
                ],
            }
        ],
    }
    path = tmp / "endpoints.json"
    path.write_text(json.dumps(feed))
    port = _port()
    cmd = [sys.executable, "-m", "gpufleet", "gateway", "--endpoints-file", str(path), "--port", str(port)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/s/bench/v1/ping", proc, {"Authorization": f"Bearer {TOKEN}"})
    return proc, port


@dataclass
class Figures:
    rps: float
    cpu_us: float
    p50: float
    p99: float


def measure(target: Target, pid: int | None, args: argparse.Namespace) -> Figures:
    async def go() -> Figures:
        rps, cpu = await saturate(target, args.concurrency, args.seconds, args.client, pid)
        p50, p99 = await fixed_rate(target, args.rate, args.seconds, args.client)
        return Figures(rps, cpu, p50, p99)

    import uvloop

    return uvloop.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw")
    ap.add_argument("--quick", action="store_true", help="--seconds 1.5 --runs 1")
    args = ap.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
        return
    if args.quick:
        args.seconds, args.runs = 1.5, 1
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    try:
        ports = [_port() for _ in range(args.replicas)]
        for p in ports:
            procs.append(subprocess.Popen([sys.executable, __file__, "--upstream", str(p)]))
        for p, proc in zip(ports, procs, strict=True):
            _wait(f"http://127.0.0.1:{p}/v1/ping", proc)
        gw, gw_port = start_gateway(tmp, ports)
        procs.append(gw)
        targets: list[tuple[Target, int | None]] = [
            (Target("direct", [(p, "/") for p in ports]), None),
            (Target("gateway", [(gw_port, "/s/bench/")], f"Authorization: Bearer {TOKEN}\r\n"), gw.pid),
        ]
        if Path(NGINX).exists():
            ng, ng_port = start_nginx(tmp, ports)
            procs.append(ng)
            targets.append((Target("nginx", [(ng_port, "/s/bench/")]), ng.pid))
        else:
            print(f"({NGINX} not found: no nginx figures)")
        results: dict[str, list[Figures]] = {t.name: [] for t, _ in targets}
        for run in range(args.runs):
            for i in range(len(targets)):
                target, pid = targets[(run + i) % len(targets)]
                print(f"run {run + 1}: {target.name}", file=sys.stderr, flush=True)
                results[target.name].append(measure(target, pid, args))
        report(results, args)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def report(results: dict[str, list[Figures]], args: argparse.Namespace) -> None:
    def med(name: str, attr: str) -> float:
        return statistics.median(getattr(f, attr) for f in results[name])

    def added(name: str, attr: str) -> float:
        runs = zip(results[name], results["direct"], strict=True)
        return statistics.median(getattr(f, attr) - getattr(d, attr) for f, d in runs)

    print(
        f"\n{args.replicas} replicas, {args.client} client; saturation: {args.concurrency} connections; "
        f"fixed rate: {args.rate:g} req/s; {args.seconds:g}s each, {args.runs} runs (medians); "
        f"{os.cpu_count()} cores\n"
    )
    print(f"{'target':<8} {'req/s':>8} {'vs direct':>9} {'CPU us/req':>10} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'added p50':>9} {'added p99':>9}")  # fmt: skip
    for name in results:
        cpu = med(name, "cpu_us")
        print(
            f"{name:<8} {med(name, 'rps'):>8.0f} {med(name, 'rps') / med('direct', 'rps'):>9.2f} "
            f"{'-' if cpu != cpu else f'{cpu:.0f}':>10} {med(name, 'p50'):>7.2f} {med(name, 'p99'):>7.2f} "
            f"{added(name, 'p50'):>9.2f} {added(name, 'p99'):>9.2f}"
        )
    gw_rps, gw_p99 = med("gateway", "rps"), added("gateway", "p99")
    print(f"\ngoal: >= {GOAL_RPS:.0f} req/s through one gateway process: {gw_rps:.0f} "
          f"({'met' if gw_rps >= GOAL_RPS else 'NOT met'})")  # fmt: skip
    print(f"goal: added p99 <= {GOAL_ADDED_P99_MS:g} ms at {args.rate:g} req/s: {gw_p99:.2f} ms "
          f"({'met' if gw_p99 <= GOAL_ADDED_P99_MS else 'NOT met'})")  # fmt: skip
    if "nginx" in results:
        ratio = statistics.median(
            g.rps / n.rps for g, n in zip(results["gateway"], results["nginx"], strict=True)
        )
        print(f"gateway / nginx req/s: {ratio:.2f}")


if __name__ == "__main__":
    main()
