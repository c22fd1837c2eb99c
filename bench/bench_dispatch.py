"""Fast dispatch (issue 21): how soon a submitted job's own script runs, and how many
short real jobs a fleet gets through a second.

Each run starts ``gpufleet server`` (subprocess, temp SQLite, ``--rate-admin off``: the
bench submits as the admin, whose default bucket of 100 requests/s would otherwise be
what is measured; admins are exempt from the pending-job cap) and ``--nodes`` agents
with ``--gpus-per-node`` simulated H100s each, in ``--procs`` worker processes (spawn),
every agent in its own thread running the real agent loop, ``Agent.run`` (whatever the
agent does to learn of new work, periodic sync or push, is what is measured). Agents
use their own node's join token (the node lane, as real agents), the default
``AgentConfig`` timing but ``--sync-interval`` (default 10 s, as a real agent). The
GPUs are simulated, the jobs are REAL processes (``ProcessRunner``: the wrapper, then
the command), run as ``nobody`` when the bench runs as root (``demo.DEMO_ACCOUNT``).

Per run, in this order:

1. *baseline*: ``GET /v1/healthz`` back to back for 2 s from ``--clients`` raw
   keep-alive connections (``bench_api.load``), before the agents start; the ratio
   ``vs healthz`` (jobs/s / healthz/s) moves less than raw rates between sittings of
   this shared 2-core machine.
2. *latency* on an idle fleet: ``--samples`` times, submit one 1-GPU job whose script
   writes the wall-clock time it started (``$EPOCHREALTIME``) to a file, wait for the
   file, then 0.5-1.5 x ``--gap`` (0.3 s; random, so samples do not line up with the
   agents' sync ticks). Latency = that time - the client's ``time.time()`` just before
   the POST. ``sched`` is its part up to the job's SCHEDULED event (server clock, same
   machine); the rest is dispatch to the agent plus the launch (wrapper + shell). On an
   idle fleet the scheduler puts every sample on the same node, which 0.3 s after the
   previous sample is often still syncing that job's exit: an agent that learns of
   work only by syncing then finds the job at that sync, and only the first sample of a
   run waits for the periodic one (the p99). ``--gap 3`` lets the node go quiet.
3. *throughput*: ``--jobs`` 1-GPU ``sleep 0.1`` jobs submitted by ``--clients`` threads
   (one httpx connection each) as fast as they go; time from the first submit to the
   last job's ``ended_at`` (COMPLETED, server clock), found by polling
   ``/v1/fleet/summary``. Verified: every job COMPLETED with exit 0, no requeue, and its
   script appended exactly one line to its own marker file. CPU seconds per 1,000 jobs
   over the phase: the server with its children (``loop``: the part of the scheduling
   loop's process; the rest is the API process, one GIL), the agent worker processes,
   the jobs (wrappers, shells, sleeps: the workers' reaped children) and this process
   (the clients and the poller); ``cores`` = CPU s / wall s.
4. *throughput, simulated*: the same with ``--sim-jobs`` jobs that carry
   ``GPUFLEET_SIMULATE_S=0.1`` (the agent starts no process and holds the GPU 0.1 s):
   the control plane (server + agents) without the cost of the processes, which on a
   small machine is most of the CPU (a Python wrapper start per job). Verified by the
   jobs' states alone (nothing runs to leave a mark).

Tables show each run and the median over ``--runs``. Goals: latency median <= 0.1 s and
p99 <= 0.3 s; >= 250 jobs/s (real processes). ``--quick``: 5 samples, 200 + 200 jobs,
1 run (a smoke run; options given explicitly still win).

``--slurm``: the same latency and throughput through ``sbatch --wrap`` (extra options:
``--slurm-args``), only where ``slurmctld`` and ``sbatch`` are on PATH and ``sinfo``
answers; the marker files go to ``--slurm-dir``, which the Slurm nodes must see.

    .venv/bin/python bench/bench_dispatch.py [--runs 3] [--nodes 50] [--gpus-per-node 8]
        [--samples 20] [--jobs 1000] [--sim-jobs 1000] [--clients 8] [--procs 1] [--sync-interval 10]
        [--quick] [--slurm [--slurm-dir DIR] [--slurm-args '--gres=gpu:1']]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import multiprocessing
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import psutil

from gpufleet.agent import SIMULATE_ENV, SystemAccounts
from gpufleet.demo import DEMO_ACCOUNT, _die_with_parent
from gpufleet.sim.config import NODES_PER_LEAF

TOKEN = "gf_bench_dispatch_admin_token"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
ACTIVE = ("PENDING", "HELD", "SCHEDULED", "RUNNING")
STAMP = "${EPOCHREALTIME:-$(date +%s.%N)}"
"""The script's start time: bash's clock variable (no fork), else date(1)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shell() -> str:
    return shutil.which("bash") or "sh"


# -- the server -------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def cpu_s(self) -> tuple[float, float]:
        """User + system CPU seconds so far of the server (API) process and of its
        children (the scheduling loop's process)."""
        own = kids = 0.0
        with contextlib.suppress(psutil.Error):
            me = psutil.Process(self.proc.pid)
            ct = me.cpu_times()
            own = ct.user + ct.system
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    ct = p.cpu_times()
                    kids += ct.user + ct.system
        return own, kids

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""


def start_server(tmp: Path) -> Server:
    db_url = f"sqlite:///{tmp / 'bench.db'}"
    subprocess.run(
        [sys.executable, "-m", "gpufleet", "db", "upgrade", "--database-url", db_url],
        check=True,
        capture_output=True,
    )
    port = _port()
    log = tmp / "server.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db_url,
             "--rate-admin", "off"],
            env={**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN},
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True,  # Ctrl-C reaches the bench only: it stops the agents first
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )  # fmt: skip
    srv = Server(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited:\n{srv.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(srv.url + "/v1/healthz", timeout=1).status_code == 200:
                return srv
        time.sleep(0.05)
    srv.stop()
    raise RuntimeError(f"the server did not start:\n{srv.tail()}")


def api(url: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


# -- the agents -------------------------------------------------------------------------------


def agents_worker(
    url: str,
    nodes: list[tuple[str, str, str]],
    work: str,
    gpus: int,
    sync_s: float,
    ready: MpEvent,
    stop: MpEvent,
) -> None:
    """One worker process: an agent per (name, join token, leaf), each in its own thread
    running ``Agent.run``, until ``stop``; then their jobs are stopped."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (``stop``)
    from gpufleet.agent import AgentConfig, HttpTransport, RunAs, SimSpec, SimulatedProbe, UserMap, make_agent

    halt = threading.Event()
    agents = []
    for name, token, leaf in nodes:
        config = AgentConfig(
            node=name, work_dir=Path(work) / name, leaf=leaf, address="127.0.0.1", sync_interval_s=sync_s
        )
        agents.append(
            make_agent(
                config=config,
                probe=SimulatedProbe(node=name, spec=SimSpec(gpus=gpus, model="H100-80GB")),
                transport=HttpTransport(url, token),
                run_as=RunAs(users=UserMap(fallback=DEMO_ACCOUNT), node=name),
            )
        )
    threads = [threading.Thread(target=a.run, args=(halt,), name=a.config.node, daemon=True) for a in agents]
    for t in threads:
        t.start()
    ready.set()
    try:
        stop.wait()
    finally:
        halt.set()
        for t in threads:
            t.join(timeout=10)
        for a in agents:
            with contextlib.suppress(Exception):
                if a.running():
                    a.stop_all(timeout_s=2.0)
            with contextlib.suppress(Exception):
                a.close()


@dataclass
class Agents:
    procs: list[BaseProcess]
    stop: MpEvent

    def cpu_s(self) -> tuple[float, float]:
        """(the workers' own CPU seconds, their reaped children's: the jobs)."""
        own = kids = 0.0
        for p in self.procs:
            with contextlib.suppress(psutil.Error, ValueError):
                ct = psutil.Process(p.pid).cpu_times()
                own += ct.user + ct.system
                kids += ct.children_user + ct.children_system
        return own, kids

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=30)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def start_agents(srv: Server, tmp: Path, args: argparse.Namespace) -> Agents:
    names = [f"node-{i:03d}" for i in range(args.nodes)]
    with api(srv.url) as c:
        tokens = {
            n: c.post("/nodes/join-tokens", json={"node": n}).raise_for_status().json()["token"]
            for n in names
        }
    nodes = [(n, tokens[n], f"leaf-{i // NODES_PER_LEAF}") for i, n in enumerate(names)]
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs: list[BaseProcess] = []
    fleet = Agents(procs=procs, stop=stop)
    readies = []
    workers = max(1, min(args.procs, args.nodes))
    try:
        for i in range(workers):
            ready = ctx.Event()
            p = ctx.Process(
                target=agents_worker,
                args=(srv.url, nodes[i::workers], str(tmp / "agents"), args.gpus_per_node,
                      args.sync_interval, ready, stop),
                name=f"agents-{i}",
                daemon=True,
            )  # fmt: skip
            p.start()
            procs.append(p)
            readies.append(ready)
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("an agent worker did not start")
        want = args.nodes * args.gpus_per_node
        deadline = time.monotonic() + 60 + 2 * args.sync_interval
        with api(srv.url) as c:
            while (s := c.get("/fleet/summary").json())["nodes_ready"] < args.nodes or s["gpus"] < want:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the fleet did not come up: {s}")
                time.sleep(0.2)
    except BaseException:
        fleet.close()
        raise
    return fleet


def kill_leftovers(tmp: Path) -> int:
    """Kill every process whose command line names our agents' work dir or the marker
    dir (job wrappers, job scripts), with its process group (a job's own session)."""
    marks = (str(tmp / "agents"), str(tmp / "marks"))
    me, killed = os.getpgrp(), 0
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if p.pid == os.getpid() or not any(m in cmd for m in marks):
            continue
        with contextlib.suppress(OSError, psutil.Error):
            pgid = os.getpgid(p.pid)
            if pgid != me:
                os.killpg(pgid, signal.SIGKILL)
            else:
                p.kill()
            killed += 1
    return killed


# -- phases -----------------------------------------------------------------------------------


def healthz_rate(srv: Server, clients: int) -> float:
    """``bench_api.py``'s baseline, the same way (raw clients in processes). Imported at
    run time: mypy (strict) would otherwise check bench_api.py too, which is not clean."""
    b = importlib.import_module("bench_api")
    call = b.Call(method="GET", path="/v1/healthz", body=b"", status=200)
    return float(
        b.load(b.Running(url=srv.url, proc=srv.proc), call, clients=clients, seconds=2.0, kind="raw").rate
    )


def _read_stamp(path: Path) -> tuple[float, str] | None:
    """A start file's time and the rest of its line (the node), once fully written."""
    try:
        text = path.read_text()
        if not text.endswith("\n"):
            return None  # half written
        at, _, rest = text.strip().partition(" ")
        return float(at), rest
    except (OSError, ValueError):
        return None  # not there yet


def wait_idle(c: httpx.Client, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(c.get("/fleet/summary").json()["jobs"].get(k, 0) for k in ACTIVE):
        if time.monotonic() > deadline:
            raise RuntimeError("the fleet did not go idle")
        time.sleep(0.1)


@dataclass
class Latency:
    samples: list[float]  # seconds, inf: the script never ran within the timeout
    sched: list[float]  # submit -> SCHEDULED (server's event)
    nodes: int  # how many nodes the samples ran on

    def q(self, p: float) -> float:
        xs = sorted(self.samples)
        return xs[max(0, math.ceil(p * len(xs)) - 1)]


def latency(srv: Server, marks: Path, args: argparse.Namespace, rng: random.Random) -> Latency:
    out: list[float] = []
    ids: list[tuple[int, float]] = []
    timeout = max(30.0, 3 * args.sync_interval)
    nodes: set[str] = set()
    with api(srv.url) as c:
        wait_idle(c, 120)
        for i in range(args.samples):
            script = f'printf "%s %s\\n" "{STAMP}" "$GPUFLEET_NODE" > {marks}/started-$GPUFLEET_JOB_ID'
            body = {"command": [_shell(), "-c", script], "gpus": 1, "team": "bench", "name": f"latency-{i}"}
            t0 = time.time()
            r = c.post("/jobs", json=body)
            if r.status_code != 201:
                raise RuntimeError(f"submit refused: {r.status_code} {r.text[:300]}")
            jid = int(r.json()["id"])
            ids.append((jid, t0))
            deadline = time.monotonic() + timeout
            while (got := _read_stamp(marks / f"started-{jid}")) is None and time.monotonic() < deadline:
                time.sleep(0.005)
            out.append(float("inf") if got is None else got[0] - t0)
            if got is not None:
                nodes.add(got[1])
            time.sleep(rng.uniform(0.5 * args.gap, 1.5 * args.gap))
        sched: list[float] = []
        for jid, t0 in ids:
            shown = c.get(f"/jobs/{jid}").json()
            at = next((e["at"] for e in shown["events"] if e["to_state"] == "SCHEDULED"), None)
            if at is not None:
                sched.append(at - t0)
        wait_idle(c, timeout)
    return Latency(samples=out, sched=sched, nodes=len(nodes))


@dataclass
class Throughput:
    jobs: int
    wall_s: float
    submit_s: float
    retries: int
    server_cpu: float
    loop_cpu: float  # of which the scheduling loop's process
    agents_cpu: float
    jobs_cpu: float
    client_cpu: float
    problems: list[str]

    @property
    def rate(self) -> float:
        return self.jobs / self.wall_s

    def per_1k(self, cpu: float) -> float:
        return cpu * 1000 / self.jobs

    def cores(self, cpu: float) -> float:
        return cpu / self.wall_s


@dataclass
class Submitter:
    """One client: its own connection, the ids it got, the 429s it was answered."""

    ids: list[int]
    retries: int = 0
    error: str | None = None

    def run(self, url: str, body: dict[str, Any], take: Callable[[], bool], go: threading.Event) -> None:
        try:
            with api(url) as c:
                c.get("/healthz")  # the connection, outside the window
                go.wait()
                while take():
                    while (r := c.post("/jobs", json=body)).status_code == 429:
                        self.retries += 1
                        time.sleep(float(r.headers.get("Retry-After", "1")))
                    if r.status_code != 201:
                        raise RuntimeError(f"submit refused: {r.status_code} {r.text[:300]}")
                    self.ids.append(int(r.json()["id"]))
        except Exception as exc:  # reported by the caller
            self.error = f"{type(exc).__name__}: {exc}"


def throughput(
    srv: Server, fleet: Agents, marks: Path, args: argparse.Namespace, *, simulated: bool = False
) -> Throughput:
    """``simulated``: the jobs carry ``GPUFLEET_SIMULATE_S=0.1`` instead (the agent runs
    nothing and holds the GPU 0.1 s): the same control plane without the processes."""
    script = f'sleep 0.1; echo "$GPUFLEET_JOB_ID $GPUFLEET_ATTEMPT" >> {marks}/done-$GPUFLEET_JOB_ID'
    body: dict[str, Any] = {"command": ["sh", "-c", script], "gpus": 1, "team": "bench", "name": "tput"}
    if simulated:
        body |= {"command": ["sleep", "0.1"], "env": {SIMULATE_ENV: "0.1"}, "name": "tput-sim"}
    n = int(args.sim_jobs if simulated else args.jobs)
    lock = threading.Lock()
    left = [n]

    def take() -> bool:
        with lock:
            left[0] -= 1
            return left[0] >= 0

    go = threading.Event()
    subs = [Submitter(ids=[]) for _ in range(args.clients)]
    threads = [threading.Thread(target=s.run, args=(srv.url, body, take, go), daemon=True) for s in subs]
    with api(srv.url) as c:
        wait_idle(c, 120)
        done0 = sum(c.get("/fleet/summary").json()["jobs"].get(k, 0) for k in TERMINAL)
        for t in threads:
            t.start()
        time.sleep(0.5)  # the clients connect
        (api0, loop0), (ag0, jobs0), me0 = srv.cpu_s(), fleet.cpu_s(), time.process_time()
        spy = _profile(srv, args, "sim" if simulated else "real")
        t0 = time.time()
        go.set()
        for t in threads:
            t.join()
        submitted_at = time.time()
        ids = sorted(x for s in subs for x in s.ids)
        retries = sum(s.retries for s in subs)
        if errors := [s.error for s in subs if s.error]:
            raise RuntimeError(f"{len(errors)} clients failed: {errors[0]}")
        deadline = time.monotonic() + max(300.0, args.jobs * 0.5)
        while True:
            jobs = c.get("/fleet/summary").json()["jobs"]
            if sum(jobs.get(k, 0) for k in TERMINAL) - done0 >= len(ids):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all jobs ended in time: {jobs}")
            time.sleep(0.1)
        (api1, loop1), (ag1, jobs1), me1 = srv.cpu_s(), fleet.cpu_s(), time.process_time()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            spy.wait(timeout=60)
        listed = _listed(c, ids)
        problems = _verify(ids, listed, None if simulated else marks, n)
        for j in [j for j in listed.values() if j["state"] != "COMPLETED"][:3]:  # why, in their words
            text = c.get(f"/jobs/{j['id']}/logs").text.strip().splitlines()
            problems.append(
                f"job {j['id']} {j['state']}/{j['exit_code']}: {text[-1] if text else 'no output'}"
            )
    ended = max((j["ended_at"] or 0.0 for j in listed.values()), default=time.time())
    return Throughput(
        jobs=len(ids),
        wall_s=max(1e-6, ended - t0),
        submit_s=submitted_at - t0,
        retries=retries,
        server_cpu=api1 - api0 + loop1 - loop0,
        loop_cpu=loop1 - loop0,
        agents_cpu=ag1 - ag0,
        jobs_cpu=jobs1 - jobs0,
        client_cpu=me1 - me0,
        problems=problems,
    )


def _profile(srv: Server, args: argparse.Namespace, what: str) -> subprocess.Popen[bytes] | None:
    """``--profile DIR``: py-spy samples the API process over a throughput phase into
    ``DIR/dispatch-WHAT.txt`` (collapsed stacks, idle threads left out)."""
    if not args.profile:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.profile) / f"dispatch-{what}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [spy, "record", "--pid", str(srv.proc.pid), "--rate", "200", "--format", "raw", "--gil"]
    cmd += ["--nonblocking", "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _listed(c: httpx.Client, ids: list[int]) -> dict[int, dict[str, Any]]:
    """The jobs ``ids`` as ``GET /v1/jobs`` lists them (id order, cursor pages)."""
    want, got = set(ids), {}
    cursor: str | None = str(min(ids) - 1) if ids else None
    while cursor is not None:
        page = c.get("/jobs", params={"limit": 1000, "cursor": cursor}).raise_for_status().json()
        for j in page["items"]:
            if j["id"] in want:
                got[j["id"]] = j
        cursor = page["next_cursor"] if len(got) < len(want) else None
    return got


def _verify(ids: list[int], listed: dict[int, dict[str, Any]], marks: Path | None, wanted: int) -> list[str]:
    """What is wrong: missing submissions, jobs not COMPLETED (exit 0, first attempt),
    marker files (in ``marks``; None: simulated jobs, none) without exactly one line,
    marker files of no job of ours."""
    bad: list[str] = []
    if len(ids) != wanted or len(set(ids)) != len(ids):
        bad.append(f"{len(set(ids))} distinct jobs accepted of {wanted}")
    states: dict[str, int] = {}
    for jid in ids:
        j = listed.get(jid)
        st = (
            "MISSING"
            if j is None
            else j["state"]
            if j["exit_code"] == 0
            else f"{j['state']}/{j['exit_code']}"
        )
        if j is not None and j["attempts"]:
            st += "/requeued"
        states[st] = states.get(st, 0) + 1
    if set(states) != {"COMPLETED"}:
        bad.append("states " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
    if marks is None:
        return bad
    lines: dict[int, int] = {}
    for f in marks.glob("done-*"):
        lines[int(f.name.removeprefix("done-"))] = len(f.read_text().splitlines())
    never = sum(1 for jid in ids if jid not in lines)
    twice = sum(1 for jid in ids if lines.get(jid, 1) > 1)
    stray = len(set(lines) - set(ids))
    if never or twice or stray:
        bad.append(f"marker files: {never} jobs never ran, {twice} ran more than once, {stray} strays")
    return bad


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Run:
    healthz: float
    latency: Latency
    tput: Throughput
    sim: Throughput | None


def one_run(args: argparse.Namespace, rng: random.Random) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as name:
        tmp = Path(name)
        tmp.chmod(0o711)  # the job account passes through to its run dir and the marker dir
        marks = tmp / "marks"
        marks.mkdir()
        marks.chmod(0o777)
        srv = start_server(tmp)
        fleet: Agents | None = None
        try:
            with api(srv.url) as c:
                c.post("/teams", json={"name": "bench"}).raise_for_status()
                c.post("/teams/bench/members", json={"user": "admin"}).raise_for_status()
            healthz = healthz_rate(srv, args.clients)
            fleet = start_agents(srv, tmp, args)
            time.sleep(1.0)
            lat = latency(srv, marks, args, rng)
            tput = throughput(srv, fleet, marks, args)
            sim = throughput(srv, fleet, marks, args, simulated=True) if args.sim_jobs else None
        except BaseException:
            if srv.proc.poll() is not None:
                print(f"the server exited ({srv.proc.returncode}):\n{srv.tail()}", file=sys.stderr)
            raise
        finally:
            if fleet is not None:
                fleet.close()
            srv.stop()
            if killed := kill_leftovers(tmp):
                print(f"(killed {killed} leftover job processes)", file=sys.stderr)
    return Run(healthz=healthz, latency=lat, tput=tput, sim=sim)


# -- Slurm, side by side ----------------------------------------------------------------------


def slurm_side_by_side(args: argparse.Namespace) -> None:
    """The same two measurements through ``sbatch --wrap`` on a running Slurm cluster
    (untested here: no Slurm on the machine this was written on)."""
    missing = [b for b in ("slurmctld", "sbatch", "sinfo") if shutil.which(b) is None]
    if missing:
        print(f"\nslurm: skipped: {', '.join(missing)} not on PATH (install and start Slurm to compare)")
        return
    if subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30, check=False).returncode != 0:
        print("\nslurm: skipped: sinfo fails (is slurmctld running?)")
        return
    base = Path(args.slurm_dir) if args.slurm_dir else None
    extra = shlex.split(args.slurm_args)

    def sbatch(script: str) -> None:
        cmd = ["sbatch", "--parsable", "--output=/dev/null", *extra, "--wrap", script]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    with tempfile.TemporaryDirectory(prefix="bench-dispatch-slurm-", dir=base) as name:
        marks = Path(name)
        marks.chmod(0o777)
        lat: list[float] = []
        rng = random.Random(2)
        for i in range(args.samples):
            stamp = marks / f"started-{i}"
            t0 = time.time()
            sbatch(f'printf "%s\\n" "{STAMP}" > {stamp}')
            deadline = time.monotonic() + 120
            while (got := _read_stamp(stamp)) is None and time.monotonic() < deadline:
                time.sleep(0.005)
            lat.append(float("inf") if got is None else got[0] - t0)
            time.sleep(rng.uniform(0.5 * args.gap, 1.5 * args.gap))
        lock, left = threading.Lock(), [args.jobs]

        def client() -> None:
            while True:
                with lock:
                    left[0] -= 1
                    if left[0] < 0:
                        return
                    n = left[0]
                sbatch(f"sleep 0.1; echo $SLURM_JOB_ID >> {marks}/done-{n}")

        t0 = time.time()
        threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + max(600.0, args.jobs)
        while len(list(marks.glob("done-*"))) < args.jobs and time.monotonic() < deadline:
            time.sleep(0.1)
        wall = time.time() - t0
        twice = sum(1 for f in marks.glob("done-*") if len(f.read_text().splitlines()) != 1)
        done = len(list(marks.glob("done-*")))
    xs = sorted(lat)
    p99 = xs[max(0, math.ceil(0.99 * len(xs)) - 1)]
    print(
        f"\nslurm (sbatch --wrap{' ' + args.slurm_args if args.slurm_args else ''}): latency median "
        f"{statistics.median(xs):.3f}s p99 {p99:.3f}s max {xs[-1]:.3f}s; {done}/{args.jobs} jobs "
        f"({twice} not exactly once) in {wall:.1f}s = {done / wall:.1f} jobs/s"
    )


# -- report -----------------------------------------------------------------------------------


def table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def report(runs: list[Run], args: argparse.Namespace) -> bool:
    med = statistics.median
    print(f"\nlatency: submit -> the job's script running, idle fleet, {args.samples} samples a run")
    rows = [["run", "median s", "p99 s", "max s", "sched s", "nodes", "lost"]]
    for i, r in enumerate(runs, 1):
        lat = r.latency
        sched = f"{med(lat.sched):.3f}" if lat.sched else "-"
        lost = sum(1 for x in lat.samples if x == float("inf"))
        rows.append(
            [
                str(i),
                f"{lat.q(0.5):.3f}",
                f"{lat.q(0.99):.3f}",
                f"{max(lat.samples):.3f}",
                sched,
                str(lat.nodes),
                str(lost),
            ]
        )
    lat_med = med(r.latency.q(0.5) for r in runs)
    lat_p99 = med(r.latency.q(0.99) for r in runs)
    rows.append(
        [
            "median",
            f"{lat_med:.3f}",
            f"{lat_p99:.3f}",
            f"{med(max(r.latency.samples) for r in runs):.3f}",
            f"{med(med(r.latency.sched) if r.latency.sched else math.nan for r in runs):.3f}",
            "",
            "",
        ]
    )
    table(rows)

    print(
        f"\nthroughput: {args.jobs} x 1-GPU 'sleep 0.1' jobs (real processes) from {args.clients} clients; "
        "CPU s per 1,000 jobs (cores = CPU s / wall s)"
    )
    tput_table([(r, r.tput) for r in runs])
    sims = [(r, r.sim) for r in runs if r.sim is not None]
    if sims:
        print(
            f"\nthroughput, simulated: {args.sim_jobs} x 1-GPU jobs holding their GPU 0.1 s, no process "
            "(the control plane alone)"
        )
        tput_table(sims)
    for i, r in enumerate(runs, 1):
        for t in (r.tput, r.sim):
            for p in t.problems if t is not None else []:
                print(f"run {i}{' (simulated)' if t is r.sim else ''}: NOT VERIFIED: {p}")
    rate = med(r.tput.rate for r in runs)
    verified = all(not r.tput.problems and not (r.sim and r.sim.problems) for r in runs)
    ok = lat_med <= 0.1 and lat_p99 <= 0.3 and rate >= 250 and verified
    print(
        f"\ngoals: latency median {lat_med:.3f} s (<= 0.1) p99 {lat_p99:.3f} s (<= 0.3), "
        f"{rate:.1f} jobs/s (>= 250), verified {'yes' if verified else 'NO'}: {'met' if ok else 'NOT met'}"
    )
    return verified


def tput_table(picks: list[tuple[Run, Throughput]]) -> None:
    med = statistics.median
    head = ["run", "jobs/s", "wall s", "submit/s", "healthz/s", "vs healthz"]
    head += ["server", "(cores)", "loop", "agents", "(cores)", "jobs", "(cores)", "bench", "429s", "verified"]

    def cells(rs: list[tuple[Run, Throughput]]) -> list[str]:
        def m(f: Callable[[Run, Throughput], float], fmt: str) -> str:
            return format(med(f(r, t) for r, t in rs), fmt)

        return [
            m(lambda r, t: t.rate, ".1f"),
            m(lambda r, t: t.wall_s, ".2f"),
            m(lambda r, t: t.jobs / t.submit_s, ".0f"),
            m(lambda r, t: r.healthz, ".0f"),
            m(lambda r, t: t.rate / r.healthz, ".4f"),
            m(lambda r, t: t.per_1k(t.server_cpu), ".1f"),
            m(lambda r, t: t.cores(t.server_cpu), ".2f"),
            m(lambda r, t: t.per_1k(t.loop_cpu), ".1f"),
            m(lambda r, t: t.per_1k(t.agents_cpu), ".1f"),
            m(lambda r, t: t.cores(t.agents_cpu), ".2f"),
            m(lambda r, t: t.per_1k(t.jobs_cpu), ".1f"),
            m(lambda r, t: t.cores(t.jobs_cpu), ".2f"),
            m(lambda r, t: t.per_1k(t.client_cpu), ".1f"),
        ]

    rows = [head]
    for i, (r, t) in enumerate(picks, 1):
        rows.append([str(i), *cells([(r, t)]), str(t.retries), "yes" if not t.problems else "NO"])
    rows.append(["median", *cells(picks), "", ""])
    table(rows)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` cleans up."""

    def handler(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--samples", type=int, default=20, help="latency samples a run")
    ap.add_argument("--gap", type=float, default=0.3, help="mean pause between latency samples (s)")
    ap.add_argument("--jobs", type=int, default=1000, help="throughput jobs a run")
    ap.add_argument("--sim-jobs", type=int, default=1000, help="simulated-job throughput phase (0: none)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--procs", type=int, default=1, help="agent worker processes")
    ap.add_argument("--sync-interval", type=float, default=10.0, help="the agents' periodic sync (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="defaults 5 samples, 200 + 200 jobs, 1 run")
    ap.add_argument("--profile", metavar="DIR", help="record the API process with py-spy into DIR")
    ap.add_argument("--slurm", action="store_true", help="also through Slurm's sbatch, if installed")
    ap.add_argument("--slurm-dir", help="marker files for Slurm jobs (visible to its nodes)")
    ap.add_argument("--slurm-args", default="", help="extra sbatch options, e.g. '--gres=gpu:1'")
    if "--quick" in sys.argv[1:]:
        ap.set_defaults(samples=5, jobs=200, sim_jobs=200, runs=1)  # what is given explicitly still wins
    args = ap.parse_args()
    if os.geteuid() == 0 and SystemAccounts().by_name(DEMO_ACCOUNT) is None:
        raise SystemExit(f"running as root, jobs run as {DEMO_ACCOUNT!r}, which has no account here")
    print(
        f"machine: {os.cpu_count()} CPUs; fleet {args.nodes} x {args.gpus_per_node} simulated GPUs in "
        f"{args.procs} agent process(es), sync every {args.sync_interval:g}s; {args.runs} run(s)",
        flush=True,
    )
    rng = random.Random(args.seed)
    runs: list[Run] = []
    try:
        with _sigterm_as_interrupt():
            for i in range(args.runs):
                runs.append(one_run(args, rng))
                r = runs[-1]
                sim = f", simulated {r.sim.rate:.1f} jobs/s" if r.sim else ""
                print(
                    f"run {i + 1}: latency median {r.latency.q(0.5):.3f}s, {r.tput.rate:.1f} jobs/s{sim}",
                    flush=True,
                )
            ok = report(runs, args)
            if args.slurm:
                slurm_side_by_side(args)
    except KeyboardInterrupt:
        print("interrupted (server, agents and jobs stopped)", file=sys.stderr)
        sys.exit(130)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
