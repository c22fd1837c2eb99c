"""The chaos harness: a real ``gpufleet server`` and ``gpufleet agent --simulate-gpus``
processes on loopback, a workload of short real jobs, and seeded faults: SIGKILL the
server (restarted on the same database), SIGKILL an agent (restarted: it re-adopts its
jobs), crash a node (SIGKILL the agent and its jobs; restarted after it was declared
lost), SIGSTOP/SIGCONT an agent for less than the lost window.

Each job appends ``start``/``end`` lines (job, attempt, node, GPUs, wall time) to one
shared file, so the checks use what really ran, not the server's view: no job ran twice
at once, no GPU held two jobs at once, every accepted job ended exactly once.
Used by ``tests/failover/test_chaos.py`` and ``bench/bench_failover.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from jobaccounts import JOB_ACCOUNT, ensure_account, passable, user_map_file

ADMIN = "gf_chaos_admin_token"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
JOB_SH = (
    'L="$CHAOS_LOG"; W="$GPUFLEET_JOB_ID $GPUFLEET_ATTEMPT $GPUFLEET_NODE $CUDA_VISIBLE_DEVICES"; '
    'echo "start $W $(date +%s.%N)" >> "$L"; '
    'trap \'echo "end $W $(date +%s.%N) term" >> "$L"; exit 143\' TERM; '
    'sleep "$1" & wait $!; echo "end $W $(date +%s.%N) ok" >> "$L"'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    seed: int = 1
    jobs: int = 200
    agents: int = 4
    gpus_per_agent: int = 4
    job_s: tuple[float, float] = (0.5, 1.5)
    plan: tuple[str, ...] = ("server",) * 4 + ("agent",) * 2 + ("node",) * 2 + ("pause",) * 2
    """The faults, shuffled by ``seed``, one every ``gap_s``."""
    gap_s: tuple[float, float] = (1.0, 2.5)
    node_timeout_s: float = 2.0
    requeue_after_s: float = 3.0
    settle_timeout_s: float = 60.0


@dataclass(slots=True)
class Summary:
    jobs: int = 0
    completed: int = 0
    lost: int = 0
    duplicates: int = 0
    gpu_conflicts: int = 0
    not_exactly_once: int = 0
    server_kills: int = 0
    agent_kills: int = 0
    node_crashes: int = 0
    pauses: int = 0
    requeued: int = 0
    attempts_run: int = 0
    wall_s: float = 0.0
    submit_s: float = 0.0
    settle_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"chaos: jobs={self.jobs} completed={self.completed} lost={self.lost} "
            f"duplicates={self.duplicates} gpu_conflicts={self.gpu_conflicts} "
            f"server_kills={self.server_kills} agent_kills={self.agent_kills} "
            f"node_crashes={self.node_crashes} pauses={self.pauses} requeued={self.requeued} "
            f"attempts_run={self.attempts_run} wall={self.wall_s:.1f}s "
            f"(submitted at {self.submit_s:.1f}s, settled at {self.settle_s:.1f}s)"
        )


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet", *args]


class Cluster:
    def __init__(self, cfg: ChaosConfig, work: Path) -> None:
        self.cfg = cfg
        self.work = work
        self.db_url = f"sqlite:///{work / 'gpufleet.db'}"
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / "runs.log"
        self.server: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes] | None] = {}
        self.crashed_at: dict[str, list[float]] = {}
        self.http = httpx.Client(headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        self.env = {**os.environ, "GPUFLEET_ADMIN_TOKEN": ADMIN}
        # jobs run as JOB_ACCOUNT (when the harness runs as root) and append to one log
        ensure_account(JOB_ACCOUNT)
        passable(work)
        self.log.touch()
        self.log.chmod(0o666)
        self.user_map = user_map_file(work)
        self.token_file = work / "agent.token"
        self.token_file.write_text(ADMIN + "\n")
        self.token_file.chmod(0o600)

    # -- processes ------------------------------------------------------------------------------
    def start_server(self) -> None:
        c = self.cfg
        args = ["server", "--port", str(self.port), "--database-url", self.db_url]
        args += ["--node-timeout", f"{c.node_timeout_s}s", "--requeue-after", f"{c.requeue_after_s}s"]
        self.server = subprocess.Popen(
            _cli(*args), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.wait_up()

    def wait_up(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/v1/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError("server did not come up")

    def start_agent(self, name: str) -> None:
        args = ["agent", "--server", self.url, "--token-file", str(self.token_file), "--name", name]
        args += ["--user-map", str(self.user_map)]
        args += ["--simulate-gpus", str(self.cfg.gpus_per_agent), "--work-dir", str(self.work / name)]
        args += ["--sync-interval", "0.5s", "--grace", "1s", "--address", "127.0.0.1"]
        self.agents[name] = subprocess.Popen(
            _cli(*args), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def kill_server(self) -> None:
        if self.server is not None:
            self.server.send_signal(signal.SIGKILL)
            self.server.wait()

    def kill_agent(self, name: str, *, with_jobs: bool) -> None:
        proc = self.agents.get(name)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.agents[name] = None
        if with_jobs:
            # Kill until none is left (a job forked while the first pass ran is caught by
            # the next), then note the time: an attempt killed here wrote no "end" line,
            # and it ended at the latest now, even if its "start" line is later than the
            # moment the crash began.
            for _ in range(20):
                if not self._kill_jobs_of(name):
                    break
                time.sleep(0.01)
            self.crashed_at.setdefault(name, []).append(time.time())

    def _kill_jobs_of(self, name: str) -> int:
        killed = 0
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                env = p.environ()
                if env.get("GPUFLEET_NODE") == name and env.get("CHAOS_LOG") == str(self.log):
                    p.kill()
                    killed += 1
        return killed

    def pause(self, name: str, seconds: float) -> None:
        proc = self.agents.get(name)
        if proc is None:
            return
        proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        for name in list(self.agents):
            self.kill_agent(name, with_jobs=True)
        self.kill_server()
        self.http.close()

    # -- API ------------------------------------------------------------------------------------
    def call(self, method: str, path: str, **kw: Any) -> Any:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = self.http.request(method, self.url + "/v1" + path, **kw)
                if r.status_code < 500:
                    r.raise_for_status()
                    return r.json()
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path} kept failing")
            time.sleep(0.2)

    def all_jobs(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 500}
            if cursor:
                params["cursor"] = cursor
            page = self.call("GET", "/jobs", params=params)
            out += page["items"]
            cursor = page["next_cursor"]
            if not cursor:
                return out


def run_chaos(cfg: ChaosConfig, work: Path) -> Summary:
    t0 = time.monotonic()
    rng = random.Random(cfg.seed)
    sm = Summary()
    cl = Cluster(cfg, work)
    try:
        cl.start_server()
        cl.call("POST", "/teams", json={"name": "chaos"})
        cl.call("POST", "/teams/chaos/members", json={"user": "admin"})
        names = [f"chaos{i}" for i in range(cfg.agents)]
        for n in names:
            cl.start_agent(n)
        specs = [
            {"command": ["sh", "-c", JOB_SH, "job", str(round(rng.uniform(*cfg.job_s), 2))], "name": f"c{i}",
             "team": "chaos", "gpus": 1 if i % 5 else 2, "max_attempts": 50, "requeue_backoff": 0,
             "env": {"CHAOS_LOG": str(cl.log)}}
            for i in range(cfg.jobs)
        ]  # fmt: skip
        with ThreadPoolExecutor(16) as pool:  # concurrent submits share group commits
            ids = [j["id"] for j in pool.map(lambda spec: cl.call("POST", "/jobs", json=spec), specs)]
        sm.jobs = len(ids)
        sm.submit_s = time.monotonic() - t0
        plan = list(cfg.plan)
        rng.shuffle(plan)
        down: dict[str, float] = {}  # crashed node -> when to restart it
        for what in plan:
            time.sleep(rng.uniform(*cfg.gap_s))
            for n, at in list(down.items()):
                if time.monotonic() >= at:
                    cl.start_agent(n)
                    del down[n]
            victim = rng.choice([n for n in names if n not in down])
            if what == "server":
                cl.kill_server()
                sm.server_kills += 1
                time.sleep(rng.uniform(0.0, 1.0))
                cl.start_server()
            elif what == "agent":
                cl.kill_agent(victim, with_jobs=False)
                sm.agent_kills += 1
                time.sleep(0.3)
                cl.start_agent(victim)
            elif what == "node":
                cl.kill_agent(victim, with_jobs=True)
                sm.node_crashes += 1
                down[victim] = time.monotonic() + cfg.node_timeout_s + cfg.requeue_after_s + 2.0
            else:
                cl.pause(victim, rng.uniform(0.5, 1.5))
                sm.pauses += 1
        while down:
            n, at = min(down.items(), key=lambda kv: kv[1])
            time.sleep(max(0.0, at - time.monotonic()))
            cl.start_agent(n)
            del down[n]
        deadline = time.monotonic() + cfg.settle_timeout_s
        jobs = cl.all_jobs()
        while any(j["state"] not in TERMINAL for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.5)
            jobs = cl.all_jobs()
        sm.settle_s = time.monotonic() - t0
        details = {j["id"]: cl.call("GET", f"/jobs/{j['id']}") for j in jobs}
    finally:
        cl.close()
    check(sm, ids, details, cl)
    sm.wall_s = time.monotonic() - t0
    return sm


def _intervals(cl: Cluster) -> list[tuple[int, int, str, tuple[int, ...], float, float | None]]:
    """(job, attempt, node, gpus, start, end) per attempt from the shared log; an attempt
    without an end line ended when its node crashed (the first crash after its start)."""
    starts: dict[tuple[int, int, str], tuple[tuple[int, ...], float]] = {}
    ends: dict[tuple[int, int, str], float] = {}
    for line in cl.log.read_text().splitlines():
        parts = line.split()
        if len(parts) < 6:
            continue
        kind, job, attempt, node, gpus, at = parts[:6]
        key = (int(job), int(attempt), node)
        if kind == "start":
            starts[key] = (tuple(int(g) for g in gpus.split(",") if g), float(at))
        elif kind == "end":
            ends[key] = float(at)
    out = []
    for key, (gpus, at) in starts.items():
        end = ends.get(key)
        if end is None:
            end = next((c for c in cl.crashed_at.get(key[2], []) if c >= at), None)
        out.append((key[0], key[1], key[2], gpus, at, end))
    return out


def check(sm: Summary, ids: list[int], details: dict[int, dict[str, Any]], cl: Cluster) -> None:
    for jid in ids:
        d = details.get(jid)
        if d is None or d["state"] not in TERMINAL:
            sm.lost += 1
            sm.problems.append(f"job {jid}: {'missing' if d is None else d['state']}")
            continue
        finals = [e for e in d["events"] if e["to_state"] in TERMINAL]
        if len(finals) != 1:
            sm.not_exactly_once += 1
            sm.problems.append(f"job {jid}: {len(finals)} final events")
        sm.completed += d["state"] == "COMPLETED"
        sm.requeued += sum(1 for e in d["events"] if e["to_state"] == "REQUEUED")
    runs = _intervals(cl)
    sm.attempts_run = len(runs)
    for r in runs:
        if r[5] is None:
            sm.problems.append(f"job {r[0]} attempt {r[1]} on {r[2]}: no end (left running?)")
    big = float("inf")
    by_job: dict[int, list[tuple[float, float, str]]] = {}
    by_gpu: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for job, _attempt, node, gpus, start, end in runs:
        by_job.setdefault(job, []).append((start, end if end is not None else big, node))
        for g in gpus:
            by_gpu.setdefault((node, g), []).append((start, end if end is not None else big, job))
    for job, spans in by_job.items():
        spans.sort()
        for a, b in itertools.pairwise(spans):
            if b[0] < a[1]:
                sm.duplicates += 1
                sm.problems.append(f"job {job} ran twice at once: {a} and {b}")
    for gpu, spans in by_gpu.items():
        spans.sort()
        for a, b in itertools.pairwise(spans):
            if b[0] < a[1]:
                sm.gpu_conflicts += 1
                sm.problems.append(f"GPU {gpu} held by jobs {a[2]} and {b[2]} at once")
