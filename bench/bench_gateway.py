"""Throughput, CPU and added latency of one ``gpufleet gateway`` process against nginx and
haproxy in front of the same replicas, and the burst-idle pattern of issue 30 through all
three.

Starts ``--replicas`` upstream replicas (each a process: uvicorn + httptools + uvloop,
a raw ASGI app answering a 40-byte JSON), then measures four targets, each
``--runs`` times (the order rotates between runs):

* *direct*: the load generator's connections spread round robin over the replicas
  (the baseline: no proxy at all);
* *gateway*: ``gpufleet gateway --endpoints-file`` (one process), ``/s/bench/`` with a
  service token (auth, request id, balancing, metrics: the whole path);
* *nginx*: ``/usr/sbin/nginx``, one worker, ``least_conn`` upstream with ``keepalive
  64`` (skipped, with a message, when nginx is not installed);
* *haproxy*: ``haproxy``, ``nbthread 1`` (one thread, as nginx's one worker and the
  gateway's one process), ``balance leastconn``, ``http-reuse always`` (skipped, with a
  message, when haproxy is not installed).

For each: *saturation* (``--concurrency`` keep-alive connections back to back for
``--seconds``: requests/s) and *fixed rate* (``--rate`` requests/s spread evenly for
``--seconds``, over a pool of connections: p50/p99 latency, from the moment a request is
written to its last byte; at this rate nothing queues, so the time a request waits
for the load generator's timer is not counted). ``added`` is the target's figure minus
direct's of the same run; ``CPU us/req`` is the proxy's CPU time (its processes') per request
during the saturation window (psutil), the figure that moves least when the machine
is busy with something else. ``x best`` compares a target with the better reference
proxy (nginx or haproxy, whichever served more requests/s) *of the same run*: its
requests/s and its CPU per request as ratios, medians over runs (issue 30's goals:
requests/s at least 0.8x, CPU per request at most 2x).

*Burst-idle* (issue 30, item 6; ``--bursts``, 0: skipped): two replicas of the real
``gpufleet model-server`` with a keep-alive of ``--replica-keep-alive`` (5 s: uvicorn's
default, the setting that made the gateway answer 502s), behind a fresh gateway, nginx
and haproxy (the same settings as above). Each cycle sends a burst of ``--burst`` KServe
infer requests (POST, 64 at once over fresh client connections, so that only the proxy's
idle upstream connections can be stale) through each proxy, then waits a gap
drawn (seeded) from ``--gap`` (``LO-HI`` seconds, 4.9-5.9 by default: around the
replicas' keep-alive, so that some reuses meet a connection just as the replica
closes it, the race of issue 30, and others one it closed a moment before). The proxies
run their cycles side by side (the same gaps), so each one's idle time is its gap. A
failure is any answer but 200, or none; the gateway's resends and ejections are read
from its ``/metrics``.

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
import random
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
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
GOAL_RPS = 2000.0
GOAL_ADDED_P99_MS = 5.0
GOAL_RPS_VS_BEST = 0.8
"""Issue 30: the gateway's requests/s at least this share of the better reference proxy's."""
GOAL_CPU_VS_BEST = 2.0
"""Issue 30: the gateway's CPU per request at most this multiple of the better proxy's."""
PROXIES = ("nginx", "haproxy")
INFER = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]})


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
    proc.kill()  # not left running: the caller has not kept it yet
    raise RuntimeError(f"{url}: not up after 30 s")


def start_nginx(tmp: Path, ports: list[int], ready: str = "v1/ping") -> tuple[subprocess.Popen[bytes], int]:
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
    _wait(f"http://127.0.0.1:{port}/s/bench/{ready}", proc)
    return proc, port


def start_haproxy(tmp: Path, ports: list[int], ready: str = "v1/ping") -> tuple[subprocess.Popen[bytes], int]:
    """haproxy as an operator would put it in front of these replicas: one thread,
    ``leastconn``, idle server connections shared by every client (``http-reuse
    always``), the ``/s/bench`` prefix stripped as nginx's ``proxy_pass .../`` does.
    Its other settings are its defaults (``retries 3``, ``retry-on conn-failure``)."""
    port = _port()
    servers = "\n".join(f"  server r{i} 127.0.0.1:{p}" for i, p in enumerate(ports))
    conf = tmp / "haproxy.cfg"
    conf.write_text(f"""global
  nbthread 1
  maxconn 4096
  pidfile {tmp}/haproxy.pid
defaults
  mode http
  option http-keep-alive
  timeout connect 2s
  timeout client 300s
  timeout server 300s
  timeout http-keep-alive 300s
frontend bench
  bind 127.0.0.1:{port}
  default_backend replicas
backend replicas
  balance leastconn
  http-reuse always
  http-request replace-path /s/bench(/.*) \\1
{servers}
""")
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(conf)], stderr=(tmp / "haproxy.log").open("wb"))
    _wait(f"http://127.0.0.1:{port}/s/bench/{ready}", proc)
    return proc, port


def start_gateway(
    tmp: Path, ports: list[int], protocol: str = "http", ready: str = "v1/ping"
) -> tuple[subprocess.Popen[bytes], int]:
    feed = {
        "at": time.time(),
        "services": [
            {
                "name": "bench",
                "protocol": protocol,
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
    path = tmp / f"endpoints-{ports[0]}.json"
    path.write_text(json.dumps(feed))
    port = _port()
    cmd = [sys.executable, "-m", "gpufleet", "gateway", "--endpoints-file", str(path), "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--metrics-public"], stderr=subprocess.DEVNULL)
    _wait(f"http://127.0.0.1:{port}/s/bench/{ready}", proc, {"Authorization": f"Bearer {TOKEN}"})
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


def _reference_proxies(
    tmp: Path, ports: list[int], procs: list[subprocess.Popen[bytes]], ready: str = "v1/ping"
) -> list[tuple[str, subprocess.Popen[bytes], int]]:
    """nginx and haproxy in front of ``ports``: those installed (a message for the others);
    each process goes into ``procs`` as it starts (stopped by the caller, whatever fails)."""
    out = []
    for name, exe, start in (("nginx", NGINX, start_nginx), ("haproxy", HAPROXY, start_haproxy)):
        if not Path(exe).exists():
            print(f"({name} not found at {exe}: no {name} figures)", flush=True)
            continue
        sub = tmp / name
        sub.mkdir(exist_ok=True)
        proc, port = start(sub, ports, ready)
        procs.append(proc)
        out.append((name, proc, port))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--client", choices=("raw", "aiohttp"), default="raw")
    ap.add_argument("--bursts", type=int, default=10, help="burst-idle cycles (0: no burst-idle phase)")
    ap.add_argument("--burst", type=int, default=200, help="requests in one burst")
    ap.add_argument("--gap", default="4.9-5.9", help="idle seconds between bursts: LO-HI, drawn uniformly")
    ap.add_argument("--replica-keep-alive", default="5s", help="the model servers' --keep-alive")
    ap.add_argument("--quick", action="store_true", help="--seconds 1.5 --runs 1 --bursts 3")
    args = ap.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
        return
    if args.quick:
        args.seconds, args.runs, args.bursts = 1.5, 1, min(args.bursts, 3)
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
        for name, proc, port in _reference_proxies(tmp, ports, procs):
            targets.append((Target(name, [(port, "/s/bench/")]), proc.pid))
        results: dict[str, list[Figures]] = {t.name: [] for t, _ in targets}
        for run in range(args.runs):
            for i in range(len(targets)):
                target, pid = targets[(run + i) % len(targets)]
                print(f"run {run + 1}: {target.name}", file=sys.stderr, flush=True)
                results[target.name].append(measure(target, pid, args))
        for proc in procs:
            proc.terminate()
        _reap(procs)
        procs.clear()
        bursts = burst_idle(tmp, args, procs) if args.bursts > 0 else None
        report(results, bursts, args)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        _reap(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- burst-idle ---------------------------------------------------------------------------


@dataclass
class Bursts:
    sent: int
    failed: int
    kinds: dict[str, int]
    """Failures by kind (status code, or the client's exception)."""
    note: str = ""


def burst_idle(
    tmp: Path, args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Bursts]:
    """Issue 30's burst-idle pattern through every proxy (see the module docstring)."""
    ports = [_port() for _ in range(2)]
    for p in ports:
        cmd = [sys.executable, "-m", "gpufleet", "model-server", "--port", str(p), "--no-access-log",
               "--launch-overhead-us", "0", "--keep-alive", args.replica_keep_alive]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stderr=subprocess.DEVNULL))
    for p, proc in zip(ports, procs, strict=True):
        _wait(f"http://127.0.0.1:{p}/v2/health/ready", proc)
    sub = tmp / "bursts"
    sub.mkdir()
    ready = "v2/health/ready"
    gw, gw_port = start_gateway(sub, ports, "kserve-v2", ready)
    procs.append(gw)
    targets = [("gateway", gw_port, {"Authorization": f"Bearer {TOKEN}"})]
    for name, _, port in _reference_proxies(sub, ports, procs, ready):
        targets.append((name, port, {}))
    got = {name: Bursts(0, 0, {}) for name, _, _ in targets}

    async def one_burst(port: int, headers: dict[str, str], into: Bursts) -> None:
        import aiohttp

        url = f"http://127.0.0.1:{port}/s/bench/v2/models/mlp/infer"
        headers = {**headers, "Content-Type": "application/json"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

            async def post() -> None:
                try:
                    async with session.post(url, data=INFER, headers=headers) as r:
                        await r.read()
                        kind = "" if r.status == 200 else str(r.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    kind = type(exc).__name__
                into.sent += 1
                if kind:
                    into.failed += 1
                    into.kinds[kind] = into.kinds.get(kind, 0) + 1

            await asyncio.gather(*(post() for _ in range(args.burst)))

    lo, _, hi = args.gap.partition("-")

    async def cycles(name: str, port: int, headers: dict[str, str]) -> None:
        draw = random.Random(30)  # the same gaps for every proxy
        for cycle in range(args.bursts):
            if name == "gateway":
                print(f"burst-idle: cycle {cycle + 1}/{args.bursts}", file=sys.stderr, flush=True)
            await one_burst(port, headers, got[name])
            await asyncio.sleep(draw.uniform(float(lo), float(hi or lo)))

    async def go() -> None:
        await asyncio.gather(*(cycles(*t) for t in targets))

    import uvloop

    uvloop.run(go())
    text = httpx.get(f"http://127.0.0.1:{gw_port}/metrics", timeout=5).text
    counts = {
        key: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(key))
        for key in ("gpufleet_gateway_retries_total", "gpufleet_gateway_ejections_total")
    }
    got["gateway"].note = (
        f"resent {counts['gpufleet_gateway_retries_total']:.0f}, "
        f"ejected {counts['gpufleet_gateway_ejections_total']:.0f}"
    )
    return got


def report(
    results: dict[str, list[Figures]], bursts: dict[str, Bursts] | None, args: argparse.Namespace
) -> None:
    def med(name: str, attr: str) -> float:
        return statistics.median(getattr(f, attr) for f in results[name])

    def added(name: str, attr: str) -> float:
        runs = zip(results[name], results["direct"], strict=True)
        return statistics.median(getattr(f, attr) - getattr(d, attr) for f, d in runs)

    proxies = [p for p in PROXIES if p in results]

    def vs_best(name: str, attr: str) -> float:
        """Median over runs of ``name``'s figure over the better proxy's of the same run."""
        if not proxies:
            return float("nan")
        ratios = []
        for run in range(args.runs):
            best = max((results[p][run] for p in proxies), key=lambda f: f.rps)
            ratios.append(getattr(results[name][run], attr) / getattr(best, attr))
        return float(statistics.median(ratios))

    def num(x: float, fmt: str) -> str:
        return "-" if x != x else format(x, fmt)

    print(
        f"\n{args.replicas} replicas, {args.client} client; saturation: {args.concurrency} connections; "
        f"fixed rate: {args.rate:g} req/s; {args.seconds:g}s each, {args.runs} runs (medians); "
        f"{os.cpu_count()} cores\n"
    )
    print(f"{'target':<8} {'req/s':>8} {'vs direct':>9} {'x best':>6} {'CPU us/req':>10} {'x best':>6} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'added p50':>9} {'added p99':>9}")  # fmt: skip
    for name in results:
        cpu_x = vs_best(name, "cpu_us") if name != "direct" else float("nan")
        rps, rps_x, cpu = med(name, "rps"), vs_best(name, "rps"), med(name, "cpu_us")
        print(
            f"{name:<8} {rps:>8.0f} {rps / med('direct', 'rps'):>9.2f} {num(rps_x, '.2f'):>6} "
            f"{num(cpu, '.0f'):>10} {num(cpu_x, '.2f'):>6} {med(name, 'p50'):>7.2f} {med(name, 'p99'):>7.2f} "
            f"{added(name, 'p50'):>9.2f} {added(name, 'p99'):>9.2f}"
        )
    print(f"(x best: against the better of {', '.join(proxies) or 'no reference proxy'} in the same run)")
    gw_rps, gw_p99 = med("gateway", "rps"), added("gateway", "p99")

    def goal(text: str, ok: bool) -> None:
        print(f"goal: {text} ({'met' if ok else 'NOT met'})")

    print()
    goal(f">= {GOAL_RPS:.0f} req/s through one gateway process: {gw_rps:.0f}", gw_rps >= GOAL_RPS)
    goal(
        f"added p99 <= {GOAL_ADDED_P99_MS:g} ms at {args.rate:g} req/s: {gw_p99:.2f} ms",
        gw_p99 <= GOAL_ADDED_P99_MS,
    )
    if proxies:
        rps_x, cpu_x = vs_best("gateway", "rps"), vs_best("gateway", "cpu_us")
        goal(f"req/s >= {GOAL_RPS_VS_BEST:g}x the better proxy's: {rps_x:.2f}x", rps_x >= GOAL_RPS_VS_BEST)
        goal(
            f"CPU per request <= {GOAL_CPU_VS_BEST:g}x the better proxy's: {cpu_x:.2f}x",
            cpu_x <= GOAL_CPU_VS_BEST,
        )
    if bursts:
        print(
            f"\nburst-idle: {args.bursts} bursts of {args.burst} infer requests, {args.gap} s idle between"
            f" (model servers with --keep-alive {args.replica_keep_alive})\n"
        )
        print(f"{'target':<8} {'requests':>8} {'failed':>6}  failures by kind")
        for name, b in bursts.items():
            kinds = ", ".join(f"{k}: {n}" for k, n in sorted(b.kinds.items())) or "-"
            print(f"{name:<8} {b.sent:>8} {b.failed:>6}  {kinds}{'  (' + b.note + ')' if b.note else ''}")
        print()
        goal(f"0 failed requests through the gateway in burst-idle: {bursts['gateway'].failed}",
             bursts["gateway"].failed == 0)  # fmt: skip


if __name__ == "__main__":
    main()
