"""The chaos harness: real ``gpufleet server`` and ``gpufleet agent --simulate-gpus``
processes on loopback, a workload of short real jobs, and seeded faults.

One server (SQLite): SIGKILL the server (restarted on the same database), SIGKILL an
agent (restarted: it re-adopts its jobs), crash a node (SIGKILL the agent and its jobs;
restarted after it was declared lost), SIGSTOP/SIGCONT an agent for less than the lost
window.

Several servers on one PostgreSQL (issue 19: ``servers=3``, ``--leader-ttl`` short): each
agent is given every server's URL (in its own order, so that they spread), the submits go
round-robin through the servers while the faults run (``storm_s``; ``GpufleetClient``, which
never sends a submit twice), and two faults more: ``leader-kill`` SIGKILLs whichever server
leads (``GET /v1/fleet/servers``), restarted ``restart_after_s`` later so that all remain;
``leader-pause`` SIGSTOPs the leader with its scheduling child (a paused machine) for
``leader_pause_s``, then SIGCONTs it: it must see that another leads and stop its loops.

Each job appends ``start``/``end`` lines (job, attempt, node, GPUs, wall time) to one
shared file, so the checks use what really ran, not the server's view: no job ran twice
at once, no GPU held two jobs at once, every accepted job ended exactly once (several
servers: and COMPLETED), and, several servers, no write of a stale epoch landed
(``check_epochs``, from the database's rows).
Used by ``tests/failover/test_chaos.py``, ``test_ha_chaos.py`` and ``bench/bench_failover.py``,
``bench/bench_ha.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
from sqlalchemy import Engine, create_engine, text

from gpufleet.client import ClientError, GpufleetClient
from jobaccounts import JOB_ACCOUNT, ensure_account, passable, user_map_file

ADMIN = "gf_chaos_admin_token"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}
JOB_SH = (
    'L="$CHAOS_LOG"; W="$GPUFLEET_JOB_ID $GPUFLEET_ATTEMPT $GPUFLEET_NODE $CUDA_VISIBLE_DEVICES"; '
    'echo "start $W $(date +%s.%N)" >> "$L"; '
    'trap \'echo "end $W $(date +%s.%N) term" >> "$L"; exit 143\' TERM; '
    'sleep "$1" & wait $!; echo "end $W $(date +%s.%N) ok" >> "$L"'
)
CLOCK_SLACK_S = 0.05
"""How far a job event's ``at`` (the writing server's clock) may lie after the start of a
later term (``leader_terms.acquired_at``, PostgreSQL's clock) before it counts as a stale
write. Here every process reads one machine's clock, so this only absorbs rounding; servers
on several machines would need their clocks' largest difference here."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    seed: int = 1
    jobs: int = 200
    agents: int = 4
    gpus_per_agent: int = 4
    job_s: tuple[float, float] = (0.5, 1.5)
    plan: tuple[str, ...] = ("server",) * 4 + ("agent",) * 2 + ("node",) * 2 + ("pause",) * 2
    """The faults, one every ``gap_s``, shuffled by ``seed`` unless ``in_order``: ``server``
    (SIGKILL a server, one of several at random; restarted 0-1 s later), ``agent``, ``node``,
    ``pause`` (an agent's), and with several servers ``leader-kill``, ``leader-pause``."""
    in_order: bool = False
    gap_s: tuple[float, float] = (1.0, 2.5)
    node_timeout_s: float = 2.0
    requeue_after_s: float = 3.0
    settle_timeout_s: float = 60.0
    servers: int = 1
    database_url: str | None = None
    """The servers' database (PostgreSQL for several); None: SQLite in the work directory."""
    leader_ttl_s: float = 2.0
    leader_pause_s: float = 40.0
    restart_after_s: float = 2.0
    """A server killed by ``leader-kill`` starts again this long after its SIGKILL."""
    server_args: tuple[str, ...] = ()
    """More ``gpufleet server`` options (``bench_ha.py``: ``--scheduler-thread``, rates)."""
    storm_s: float | None = None
    """None: every job is submitted before the faults begin. A number: the submits are
    spread evenly over this many seconds, from when the faults begin."""


def issue_scenario(database_url: str, *, seed: int = 19) -> ChaosConfig:
    """Issue 19's scenario: three servers, 20 agents, a submit storm through all three;
    SIGKILL the leader, later SIGSTOP the next leader for 40 s and resume it.

    Agents sync every 0.5 s with ``--leader-ttl`` 2 s; the lost window (node timeout 10 s +
    requeue-after 30 s) is longer than an agent's stall on a paused server (its sync's
    read timeout, 30 s, then it moves on): a node whose server is paused is not declared
    lost while it runs its jobs, as with the defaults (90 s)."""
    return ChaosConfig(
        seed=seed,
        jobs=400,
        agents=20,
        plan=("leader-kill", "leader-pause"),
        in_order=True,
        gap_s=(5.0, 5.0),
        node_timeout_s=10.0,
        requeue_after_s=30.0,
        settle_timeout_s=120.0,
        servers=3,
        database_url=database_url,
        leader_pause_s=40.0,
        storm_s=55.0,
    )


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
    servers: int = 1
    agents: int = 0
    unanswered: int = 0
    """Submits that got no answer (a server killed or paused under them): not 201, so not
    required to exist; ``unanswered_made`` of them did, and are checked like the others."""
    unanswered_made: int = 0
    leader_kills: int = 0
    leader_pauses: int = 0
    leader_pause_s: float = 0.0
    terms: int = 0
    stale_writes: int = 0
    takeover_s: list[float] = field(default_factory=list)
    """Per leader fault: its signal -> a new leader named by ``GET /v1/fleet/servers``."""
    first_pass_s: list[float] = field(default_factory=list)
    """Per leader fault: its signal -> the new term's first job event (its ``at``)."""
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.servers == 1:
            return (
                f"chaos: jobs={self.jobs} completed={self.completed} lost={self.lost} "
                f"duplicates={self.duplicates} gpu_conflicts={self.gpu_conflicts} "
                f"server_kills={self.server_kills} agent_kills={self.agent_kills} "
                f"node_crashes={self.node_crashes} pauses={self.pauses} requeued={self.requeued} "
                f"attempts_run={self.attempts_run} wall={self.wall_s:.1f}s "
                f"(submitted at {self.submit_s:.1f}s, settled at {self.settle_s:.1f}s)"
            )

        def secs(xs: list[float]) -> str:
            return ",".join(f"{x:.1f}s" for x in xs) or "-"

        return (
            f"ha-chaos: servers={self.servers} agents={self.agents} jobs={self.jobs} "
            f"completed={self.completed} lost={self.lost} unanswered={self.unanswered} "
            f"(made {self.unanswered_made}) duplicates={self.duplicates} "
            f"gpu_conflicts={self.gpu_conflicts} stale_writes={self.stale_writes} "
            f"leader_kills={self.leader_kills} leader_pauses={self.leader_pauses} "
            f"(stopped {self.leader_pause_s:.0f}s) server_kills={self.server_kills} terms={self.terms} "
            f"takeover={secs(self.takeover_s)} first_pass={secs(self.first_pass_s)} "
            f"requeued={self.requeued} attempts_run={self.attempts_run} wall={self.wall_s:.1f}s "
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
        if cfg.servers > 1 and not (cfg.database_url or "").startswith("postgresql"):
            raise ValueError("several servers share a PostgreSQL database: set database_url")
        self.cfg = cfg
        self.work = work
        self.db_url = cfg.database_url or f"sqlite:///{work / 'gpufleet.db'}"
        self.ports = [_port() for _ in range(cfg.servers)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.log = work / "runs.log"
        self.servers: list[subprocess.Popen[bytes] | None] = [None] * cfg.servers
        self.ids: list[str] = [""] * cfg.servers
        self.down: set[int] = set()  # killed or paused: not asked
        self.agents: dict[str, subprocess.Popen[bytes] | None] = {}
        self.crashed_at: dict[str, list[float]] = {}
        self.marks: list[tuple[int, int]] = []  # (epoch seen leading, last job event id then)
        self.faults: list[tuple[float, int]] = []  # (a leader fault's signal, the epoch after it)
        self.engine: Engine | None = create_engine(self.db_url) if cfg.servers > 1 else None
        self.http = httpx.Client(headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        # several servers of one database share the key tokens are stored under
        secret = {"GPUFLEET_TOKEN_SECRET": secrets.token_urlsafe(32)} if cfg.servers > 1 else {}
        self.env = {**os.environ, "GPUFLEET_ADMIN_TOKEN": ADMIN, **secret}
        self._logs: list[IO[bytes]] = []
        # jobs run as JOB_ACCOUNT (when the harness runs as root) and append to one log
        ensure_account(JOB_ACCOUNT)
        passable(work)
        self.log.touch()
        self.log.chmod(0o666)
        self.user_map = user_map_file(work)
        self.token_file = work / "agent.token"
        self.token_file.write_text(ADMIN + "\n")
        self.token_file.chmod(0o600)

    def _out(self, name: str) -> IO[bytes]:
        """A process's stderr: a file in the work directory (read it when a run fails)."""
        f = (self.work / f"{name}.log").open("ab")
        self._logs.append(f)
        return f

    # -- processes ------------------------------------------------------------------------------
    def start_all(self) -> list[str]:
        """The servers (the first makes the schema, then the others at once), the team and
        the agents; their names."""
        self.start_server(0)
        for i in range(1, len(self.urls)):
            self.start_server(i, wait=False)
        for i in range(1, len(self.urls)):
            self.wait_up(i)
        self.call("POST", "/teams", json={"name": "chaos"})
        self.call("POST", "/teams/chaos/members", json={"user": "admin"})
        names = [f"chaos{i}" for i in range(self.cfg.agents)]
        for n in names:
            self.start_agent(n)
        return names

    def start_server(self, i: int = 0, *, wait: bool = True) -> None:
        c = self.cfg
        args = ["server", "--port", str(self.ports[i]), "--database-url", self.db_url]
        args += ["--node-timeout", f"{c.node_timeout_s}s", "--requeue-after", f"{c.requeue_after_s}s"]
        if c.servers > 1:
            args += ["--leader-ttl", f"{c.leader_ttl_s}s"]
        args += c.server_args
        self.servers[i] = subprocess.Popen(
            _cli(*args), env=self.env, stdout=subprocess.DEVNULL, stderr=self._out(f"server{i}")
        )
        if wait:
            self.wait_up(i)

    def wait_up(self, i: int = 0, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.urls[i] + "/v1/healthz", timeout=1).status_code == 200:
                    break
            proc = self.servers[i]
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"server {i} exited ({proc.returncode}): see {self.work / f'server{i}.log'}"
                )
            time.sleep(0.05)
        else:
            raise RuntimeError(f"server {i} did not come up")
        self.down.discard(i)
        if self.cfg.servers > 1:
            self.ids[i] = self.call("GET", "/fleet/servers", at=i)["me"]

    def start_agent(self, name: str) -> None:
        k = int(name.removeprefix("chaos")) % len(self.urls)
        urls = ",".join(self.urls[k:] + self.urls[:k])  # each agent its own first server
        args = ["agent", "--server", urls, "--token-file", str(self.token_file), "--name", name]
        args += ["--user-map", str(self.user_map)]
        args += ["--simulate-gpus", str(self.cfg.gpus_per_agent), "--work-dir", str(self.work / name)]
        args += ["--sync-interval", "0.5s", "--grace", "1s", "--address", "127.0.0.1"]
        self.agents[name] = subprocess.Popen(
            _cli(*args), env=self.env, stdout=subprocess.DEVNULL, stderr=self._out(name)
        )

    def kill_server(self, i: int = 0) -> None:
        proc = self.servers[i]
        if proc is not None:
            self.down.add(i)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
            proc.wait()

    def signal_tree(self, i: int, sig: signal.Signals) -> None:
        """``sig`` to server ``i`` and its children (the scheduling loop's process)."""
        proc = self.servers[i]
        if proc is None:
            return
        with contextlib.suppress(psutil.Error):
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)

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
        """Every process of the node's jobs: their own (marked in their environment) and
        their root wrappers (which run with a fixed environment of their own, so they are
        found by the attempt files under the node's work dir on their command line): a
        crashed node leaves no wrapper to record an exit code either."""
        killed = 0
        work = str(self.work / name) + os.sep
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                env = p.environ()
                ours = env.get("GPUFLEET_NODE") == name and env.get("CHAOS_LOG") == str(self.log)
                wrapper = any(a.startswith(work) for a in p.cmdline()[1:])
                if ours or wrapper:
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
        for i in range(len(self.servers)):
            self.signal_tree(i, signal.SIGCONT)  # a paused one's child too: it ends on its EOF
            self.kill_server(i)
        self.http.close()
        if self.engine is not None:
            self.engine.dispose()
        for f in self._logs:  # (after the kills: nothing writes to them any more)
            f.close()

    # -- API ------------------------------------------------------------------------------------
    def call(self, method: str, path: str, *, at: int | None = None, **kw: Any) -> Any:
        """The answer of server ``at``, or of the servers up in turn; transport errors and
        5xx are tried again for 30 s (not for submits during faults: ``storm``)."""
        deadline = time.monotonic() + 30
        k = 0
        while True:
            up = [i for i in range(len(self.urls)) if i not in self.down] or [0]
            i = at if at is not None else up[k % len(up)]
            k += 1
            try:
                r = self.http.request(method, self.urls[i] + "/v1" + path, **kw)
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

    # -- leaders --------------------------------------------------------------------------------
    def leader(self, *, not_in: frozenset[str] = frozenset(), timeout: float = 30.0) -> tuple[int, int]:
        """(server index, epoch) once a server up names one of ours, not in ``not_in``, leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in set(range(len(self.urls))) - self.down:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    st = self.http.get(self.urls[i] + "/v1/fleet/servers", timeout=2).json()
                    lead = st.get("leader")
                    if lead and lead not in not_in and lead in self.ids:
                        return self.ids.index(lead), int(st["epoch"])
            time.sleep(0.05)
        raise RuntimeError(f"no new leader in {timeout:g}s")

    def leading(self, i: int) -> bool:
        """Whether server ``i`` runs the loops now (its ``gpufleet_leader``)."""
        body = self.http.get(self.urls[i] + "/metrics", timeout=5).text
        return any(ln.startswith("gpufleet_leader{") and ln.endswith(" 1.0") for ln in body.splitlines())

    def mark(self, epoch: int, since: float) -> None:
        """A new leader (``epoch``) seen ``since`` a fault: from now on no job event of an
        older epoch may land (``check_epochs``), so note the last event id."""
        assert self.engine is not None
        with self.engine.connect() as c:
            last = c.execute(text("SELECT coalesce(max(id), 0) FROM job_events")).scalar_one()
        self.marks.append((epoch, int(last)))
        self.faults.append((since, epoch))


def leader_kill(cl: Cluster, sm: Summary) -> None:
    i, _ = cl.leader()
    t = time.time()
    cl.kill_server(i)
    sm.leader_kills += 1
    _, new = cl.leader(not_in=frozenset({cl.ids[i]}))
    sm.takeover_s.append(time.time() - t)
    cl.mark(new, t)
    time.sleep(max(0.0, t + cl.cfg.restart_after_s - time.time()))
    cl.start_server(i)


def leader_pause(cl: Cluster, sm: Summary) -> None:
    i, _ = cl.leader()
    t = time.time()
    cl.down.add(i)
    cl.signal_tree(i, signal.SIGSTOP)
    sm.leader_pauses += 1
    try:
        _, new = cl.leader(not_in=frozenset({cl.ids[i]}), timeout=cl.cfg.leader_pause_s + 30)
        sm.takeover_s.append(time.time() - t)
        cl.mark(new, t)
        time.sleep(max(0.0, t + cl.cfg.leader_pause_s - time.time()))
    finally:
        cl.signal_tree(i, signal.SIGCONT)
        sm.leader_pause_s = time.time() - t
        cl.down.discard(i)
    deadline = time.monotonic() + 30
    while cl.leading(i):  # it wakes, sees the newer holder (or its stale lease), stops its loops
        if time.monotonic() > deadline:
            sm.problems.append(f"server {i} still leads 30 s after its pause")
            break
        time.sleep(0.1)


def storm(cl: Cluster, specs: list[dict[str, Any]], seconds: float) -> tuple[list[int], list[str]]:
    """Submit ``specs`` evenly over ``seconds``, round-robin through the servers (each
    client starts with its own server, moves on only when one was never reached). The ids
    of the 201s, and the names of the submits that got no answer."""
    clients = [
        GpufleetClient(cl.urls[k:] + cl.urls[:k], ADMIN, timeout=10.0, max_wait_s=30.0)
        for k in range(len(cl.urls))
    ]
    ids: list[int] = []
    unanswered: list[str] = []
    t0 = time.monotonic()

    def one(k: int) -> None:
        time.sleep(max(0.0, t0 + k * seconds / len(specs) - time.monotonic()))
        try:
            ids.append(int(clients[k % len(clients)].request("POST", "/jobs", json=specs[k])["id"]))
        except ClientError as exc:
            if exc.status is not None and exc.status < 500:
                raise
            unanswered.append(specs[k]["name"])

    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(len(specs))))
    finally:
        for c in clients:
            c.close()
    return ids, unanswered


def run_chaos(cfg: ChaosConfig, work: Path) -> Summary:
    t0 = time.monotonic()
    rng = random.Random(cfg.seed)
    sm = Summary(servers=cfg.servers, agents=cfg.agents)
    cl = Cluster(cfg, work)
    try:
        names = cl.start_all()
        specs = [
            {"command": ["sh", "-c", JOB_SH, "job", str(round(rng.uniform(*cfg.job_s), 2))], "name": f"c{i}",
             "team": "chaos", "gpus": 1 if i % 5 else 2, "max_attempts": 50, "requeue_backoff": 0,
             "env": {"CHAOS_LOG": str(cl.log)}}
            for i in range(cfg.jobs)
        ]  # fmt: skip
        got: list[tuple[list[int], list[str]]] = []
        if cfg.storm_s is None:
            with ThreadPoolExecutor(16) as pool:  # concurrent submits share group commits
                got.append(
                    ([j["id"] for j in pool.map(lambda b: cl.call("POST", "/jobs", json=b), specs)], [])
                )
            sm.submit_s = time.monotonic() - t0
            inject(cl, sm, rng, names)
        else:
            storm_s = cfg.storm_s
            stormer = threading.Thread(target=lambda: got.append(storm(cl, specs, storm_s)))
            stormer.start()
            inject(cl, sm, rng, names)
            stormer.join()
            sm.submit_s = time.monotonic() - t0
        if not got:
            raise RuntimeError("the submit storm failed (a 4xx answer): see the traceback above")
        ids, unanswered = got[0]
        sm.jobs = len(ids)
        deadline = time.monotonic() + cfg.settle_timeout_s
        jobs = cl.all_jobs()
        while any(j["state"] not in TERMINAL for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.5)
            jobs = cl.all_jobs()
        sm.settle_s = time.monotonic() - t0
        details = {j["id"]: cl.call("GET", f"/jobs/{j['id']}") for j in jobs}
        if cl.engine is not None:
            check_epochs(sm, cl)
    finally:
        cl.close()
    sm.unanswered = len(unanswered)
    made = {d["name"]: jid for jid, d in details.items()}
    extra = [made[n] for n in unanswered if n in made]
    sm.unanswered_made = len(extra)
    check(sm, ids, details, cl, extra=extra)
    sm.wall_s = time.monotonic() - t0
    return sm


def inject(cl: Cluster, sm: Summary, rng: random.Random, names: list[str]) -> None:
    """The plan's faults, one every ``gap_s``; a crashed node starts again once it was
    declared lost."""
    cfg = cl.cfg
    plan = list(cfg.plan)
    if not cfg.in_order:
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
            i = rng.randrange(cfg.servers)
            cl.kill_server(i)
            sm.server_kills += 1
            time.sleep(rng.uniform(0.0, 1.0))
            cl.start_server(i)
        elif what == "leader-kill":
            leader_kill(cl, sm)
        elif what == "leader-pause":
            leader_pause(cl, sm)
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
    for key, (held, began) in starts.items():
        end = ends.get(key)
        if end is None:
            end = next((c for c in cl.crashed_at.get(key[2], []) if c >= began), None)
        out.append((key[0], key[1], key[2], held, began, end))
    return out


def check(
    sm: Summary,
    ids: list[int],
    details: dict[int, dict[str, Any]],
    cl: Cluster,
    *,
    extra: Sequence[int] = (),
) -> None:
    """``ids``: the 201s (each must exist and end, and with several servers complete);
    ``extra``: jobs made by submits that got no answer (each must end exactly once)."""
    for jid in [*ids, *extra]:
        d = details.get(jid)
        if d is None or d["state"] not in TERMINAL or (cl.cfg.servers > 1 and d["state"] != "COMPLETED"):
            sm.lost += 1
            sm.problems.append(f"job {jid}: {'missing' if d is None else d['state']}")
            continue
        finals = [e for e in d["events"] if e["to_state"] in TERMINAL]
        if len(finals) != 1:
            sm.not_exactly_once += 1
            sm.problems.append(f"job {jid}: {len(finals)} final events")
        if jid in extra:
            continue
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
    for gpu, held in by_gpu.items():
        held.sort()
        for first, then in itertools.pairwise(held):
            if then[0] < first[1]:
                sm.gpu_conflicts += 1
                sm.problems.append(f"GPU {gpu} held by jobs {first[2]} and {then[2]} at once")


def check_epochs(sm: Summary, cl: Cluster) -> None:
    """No write with a stale epoch landed, from the rows (job events of a leader's loop
    carry its epoch; ``leader_terms`` says when each term began, by PostgreSQL's clock):

    1. in id order the epochs never go back (a fenced write holds the lease row until it
       commits and takes its ids after the fence, so ids follow the commits);
    2. no event of epoch e is stamped after a later term began (``at`` is the writing
       server's clock, read before its commit; ``CLOCK_SLACK_S``);
    3. no event of an older epoch has an id above the last one committed when the harness
       saw a newer leader (``Cluster.mark``): it would have committed after that term began.

    Also the new terms' first events, for ``first_pass_s``."""
    assert cl.engine is not None
    with cl.engine.connect() as c:
        events = c.execute(
            text("SELECT id, epoch, at FROM job_events WHERE epoch IS NOT NULL ORDER BY id")
        ).all()
        began: dict[int, float] = {
            int(e): float(t) for e, t in c.execute(text("SELECT epoch, acquired_at FROM leader_terms"))
        }
    sm.terms = len(began)
    top = 0
    first: dict[int, float] = {}
    for eid, epoch, at in events:
        first[epoch] = min(first.get(epoch, at), at)
        if epoch < top:
            sm.stale_writes += 1
            sm.problems.append(f"job event {eid}: epoch {epoch} after epoch {top} (id order)")
        top = max(top, epoch)
        later = [t for e, t in began.items() if e > epoch]
        if later and at > min(later) + CLOCK_SLACK_S:
            sm.stale_writes += 1
            sm.problems.append(
                f"job event {eid} of epoch {epoch} at {at:.3f}: a later term began {min(later):.3f}"
            )
        for newer, last in cl.marks:
            if epoch < newer and eid > last:
                sm.stale_writes += 1
                sm.problems.append(f"job event {eid} of epoch {epoch} landed after epoch {newer} was seen")
    sm.first_pass_s = [first[epoch] - t for t, epoch in cl.faults if epoch in first]
