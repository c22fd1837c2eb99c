"""``gpufleet demo``: a whole simulated fleet on one machine.

- the server (``gpufleet server``, a child process) on SQLite in the data dir (default:
  a fresh temp dir, removed at exit; ``--data-dir`` keeps it and reuses its admin token),
  migrated by the demo itself;
- ``--nodes`` agents (default 50) in this process, each a real HTTP client of the server
  over loopback with ``--gpus-per-node`` simulated H100s, ``--nodes-per-leaf`` per leaf switch, each
  with its own node credential; one node's GPUs in MIG mode (``MIG_LAYOUTS``: node-007, or
  the last node of a smaller fleet) so that ``gpufleet node mig`` and jobs on slices
  (``--mig 1g.10gb:2``) run as the README shows them; prices from the bundled ``data/prices-example.json``
  (off-peak 22:00-08:00 Europe/Berlin x0.5, weekends x0.6) and a budget for team speech;
- an inference service (``demoservice.py``): ``gpufleet model-server`` as service ``mlp``
  on the fleet (autoscaled 1..4 replicas on GPU utilisation, 1 warm), a gateway on
  ``--gateway-port`` (default 8081) embedded in this process, a daily load curve on it
  (with the workload), and a curl line that calls it through the gateway;
- a background workload (``demoworkload.py``, with the demo's teams, users, budgets and
  bookings): the bundled Philly sample replayed ``--speed`` times faster
  (durations also divided by it, clamped to 2..120 s), submitted through the API by five
  demo users in three teams. Trace jobs are *simulated* (``GPUFLEET_SIMULATE_S``): they
  hold their GPUs and drive the simulated telemetry, nothing runs. Jobs you submit
  yourself (``gpufleet submit -- echo hi``, as admin: member of team ``demo``) run as
  real processes on the simulated nodes, as ``nobody`` when the demo runs as root (its
  users have no accounts here); ``gpufleet logs ID`` shows their output.

This module runs the fleet's processes (the server, the agents, the gateway through
``demoservice.py``) and the console; ``demoworkload.py`` is what the demo asks of them,
as a client of the API.

Ctrl-C (SIGINT) or SIGTERM stops the workload, the agents' jobs, the agents and the
server, and exits 0. The server dies with the demo even if the demo is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from gpufleet.agent import (
    Agent,
    AgentConfig,
    HttpTransport,
    RunAs,
    SimSpec,
    SimulatedProbe,
    UserMap,
    make_agent,
)
from gpufleet.agent.config import SYNC_INTERVAL_S
from gpufleet.client import tls_verify
from gpufleet.demoservice import DemoService
from gpufleet.demoworkload import ADMIN_TEAM, TraceReplay, book_reservations, setup_accounts
from gpufleet.migindex import layout_words
from gpufleet.sim.config import NODES_PER_LEAF

DEMO_ACCOUNT = "nobody"
"""The POSIX account every demo user's real jobs run as when the demo runs as root:
not even the demo runs a job as root. (Run as another user, jobs run as that user.)"""
MIG_NODE = 7
"""The node whose GPUs are in MIG mode (node-007); a fleet of fewer nodes: its last node
(none on a one-node fleet, whose whole GPUs the README's first job needs)."""
MIG_LAYOUTS: dict[int, tuple[str, ...]] = {
    0: ("1g.10gb",) * 7,
    1: ("2g.20gb", "2g.20gb", "3g.40gb"),
    2: ("3g.40gb", "3g.40gb"),
    3: ("7g.80gb",),
    4: (),
    5: (),
    6: (),
    7: (),
}
"""GPU index -> its MIG instances on the MIG node (``gpufleet.mig``'s H100-80GB profiles):
a few laid out for slice jobs at once, the rest in MIG mode with no instance yet, for
``gpufleet node mig`` (or ``gpufleet server --auto-mig``) to lay out. A node of fewer GPUs
takes the first ones. A MIG GPU is never handed out whole: the demo's 400 GPUs are 392
whole ones and this node's slices."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    nodes: int = 50
    gpus_per_node: int = 8
    port: int = 8080
    host: str = "127.0.0.1"
    workload: bool = True
    data_dir: Path | None = None
    nodes_per_leaf: int = NODES_PER_LEAF
    speed: float = 300.0
    admin_token: str | None = None
    tls: bool = False
    """Serve HTTPS with the demo's own CA; agents enrol for node certificates (mTLS)."""
    sync_interval_s: float = SYNC_INTERVAL_S
    """A real agent's (10 s): pushes and exits reach the agents at once anyway, and an idle
    node's periodic sync is a lease renewal (issue 35; ``bench/bench_idle.py``)."""
    agent_threads: int = 16
    max_job_s: float = 120.0
    gateway_port: int = 8081
    service: bool = True
    """Deploy the inference service ``mlp`` and embed a gateway for it."""
    mig: bool = True
    """One node's GPUs in MIG mode (``mig_node``, ``MIG_LAYOUTS``)."""

    @property
    def mig_node(self) -> str | None:
        """The node whose GPUs are in MIG mode, or None."""
        if not self.mig or self.nodes < 2:
            return None
        return f"node-{min(MIG_NODE, self.nodes - 1):03d}"


def _die_with_parent() -> None:  # runs in the child before exec (Linux only)
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _admin_token(data: Path, given: str | None) -> str:
    path = data / "admin-token"
    if given:
        token = given
    elif path.exists():
        token = path.read_text().strip()
    else:
        token = "gf_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


class Demo:
    def __init__(self, opts: DemoOptions) -> None:
        self.opts = opts
        self.cleanup = opts.data_dir is None
        self.data = opts.data_dir or Path(tempfile.mkdtemp(prefix="gpufleet-demo-"))
        self.data.mkdir(parents=True, exist_ok=True)
        self.url = f"{'https' if opts.tls else 'http'}://{opts.host}:{opts.port}"
        self.ca_file: str | None = None
        self.stop = threading.Event()
        self.server: subprocess.Popen[bytes] | None = None
        self.agents: list[Agent] = []
        self.threads: list[threading.Thread] = []
        self.summary: dict[str, Any] = {}
        self.token = ""
        self.scratch: Path | None = None
        self.service: DemoService | None = None
        self.workload = TraceReplay(
            api=self.api,
            stop=self.stop,
            pending=lambda: int(self.summary.get("jobs", {}).get("PENDING", 0)),
            nodes=opts.nodes,
            gpus_per_node=opts.gpus_per_node,
            speed=opts.speed,
            max_job_s=opts.max_job_s,
        )

    # -- server -----------------------------------------------------------------------------
    def start_server(self) -> str | None:
        from gpufleet.server.store import db

        db_url = f"sqlite:///{self.data / 'gpufleet.db'}"
        db.upgrade(db_url)
        self.token = _admin_token(self.data, self.opts.admin_token)
        log = open(self.data / "server.log", "ab")  # noqa: SIM115 (lives as long as the child)
        tls: list[str] = []
        if self.opts.tls:
            from gpufleet.pki import CertificateAuthority

            pki = self.data / "pki"
            crt, key = CertificateAuthority.load_or_create(pki).issue_server(
                [self.opts.host, "localhost"], pki
            )
            self.ca_file = str(pki / "ca.crt")
            tls = ["--tls-cert", str(crt), "--tls-key", str(key), "--ca-dir", str(pki)]
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "server",
                "--host",
                self.opts.host,
                "--port",
                str(self.opts.port),
                "--database-url",
                db_url,
                "--node-timeout",
                "30s",
                "--prices",
                str(resources.files("gpufleet") / "data" / "prices-example.json"),
                *tls,
            ],
            env={**os.environ, "GPUFLEET_ADMIN_TOKEN": self.token},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                tail = (self.data / "server.log").read_text(errors="replace")[-2000:]
                return f"the server exited:\n{tail}"
            with contextlib.suppress(httpx.HTTPError):
                if (
                    httpx.get(
                        self.url + "/v1/healthz", timeout=1, verify=tls_verify(self.ca_file)
                    ).status_code
                    == 200
                ):
                    return None
            time.sleep(0.1)
        return "the server did not answer within 30 s"

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url + "/v1",
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=30,
            verify=tls_verify(self.ca_file),
        )

    # -- credentials ------------------------------------------------------------------------
    def join_tokens(self, names: list[str]) -> dict[str, str]:
        with self.api() as c:
            return {n: c.post("/nodes/join-tokens", json={"node": n}).json()["token"] for n in names}

    # -- bookings ---------------------------------------------------------------------------
    def book_reservations(self) -> None:
        """The page's calendar (``demoworkload.book_reservations``), once the nodes are in."""
        with self.api() as c:
            book_reservations(c, nodes=self.opts.nodes, gpus_per_node=self.opts.gpus_per_node, stop=self.stop)

    # -- agents -----------------------------------------------------------------------------
    def agents_root(self) -> Path:
        """Where the agents keep their jobs. Run as root, the demo runs every job as
        ``nobody`` (its users are made up: ``DEMO_ACCOUNT``), which must pass through
        this directory's parents to reach its own; a data dir under a private home does
        not allow that, so the agents then work in a scratch dir removed at exit."""
        root = self.data / "agents"
        if os.geteuid() != 0:
            return root
        if self.cleanup:
            self.data.chmod(0o711)  # our own temp dir (mkdtemp makes it 0700)
        if all(p.stat().st_mode & 0o001 for p in (self.data, *self.data.parents)):
            return root
        self.scratch = Path(tempfile.mkdtemp(prefix="gpufleet-demo-agents-"))
        self.scratch.chmod(0o711)
        return self.scratch

    def transport(self, node: str, token: str, work: Path) -> HttpTransport:
        """The agent's link to the server: its join token over HTTP, or with ``--tls``
        the node certificate it trades the token for (mTLS, as a real agent does)."""
        if not self.opts.tls:
            return HttpTransport(self.url, token)
        from gpufleet.agent.enroll import ensure_certificate

        cert = ensure_certificate(
            url=self.url, node=node, directory=work / "pki", token=token, ca_file=self.ca_file
        )
        return HttpTransport(self.url, ca_file=self.ca_file, cert=cert)

    def start_agents(self) -> None:
        o = self.opts
        names = [f"node-{i:03d}" for i in range(o.nodes)]
        tokens = self.join_tokens(names)
        work = self.agents_root()
        hooks = demo_upgrade_hooks(work)
        for i, name in enumerate(names):
            leaf = i // o.nodes_per_leaf
            config = AgentConfig(
                node=name,
                work_dir=work / name,
                leaf=f"leaf-{leaf}",
                rack=f"rack-{leaf // 2}",
                address="127.0.0.1",
                sync_interval_s=o.sync_interval_s,
                grace_s=5.0,
                upgrade_hooks=hooks,
            )
            probe = SimulatedProbe(
                node=name,
                spec=SimSpec(gpus=o.gpus_per_node, model="H100-80GB"),
                mig={g: p for g, p in MIG_LAYOUTS.items() if g < o.gpus_per_node}
                if name == o.mig_node
                else None,
            )
            bot = make_agent(
                config=config,
                probe=probe,
                transport=self.transport(name, tokens[name], work / name),
                run_as=RunAs(users=UserMap(fallback=DEMO_ACCOUNT), node=name),
            )
            bot.restore()
            self.agents.append(bot)
        groups = max(1, min(o.agent_threads, len(self.agents)))
        for g in range(groups):
            mine = self.agents[g::groups]
            t = threading.Thread(target=self._run_agents, args=(mine,), name=f"agents-{g}", daemon=True)
            t.start()
            self.threads.append(t)

    def _run_agents(self, agents: list[Agent]) -> None:
        random.Random(len(agents)).shuffle(agents)
        tick_s = min((bot.config.tick_s for bot in agents), default=0.5)  # a real agent's loop
        kick = threading.Event()  # any of them pushed by the server, or a job of theirs ended
        for bot in agents:
            bot.kick = kick
            bot.start_watch(self.stop)
        while not self.stop.is_set():
            for bot in agents:
                if self.stop.is_set():
                    return
                with contextlib.suppress(Exception):  # one agent's bad turn must not stop the rest
                    bot.step()
            kick.wait(tick_s)
            kick.clear()

    # -- status -----------------------------------------------------------------------------
    def poll_summary(self) -> None:
        with self.api() as c:
            while not self.stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    r = c.get("/fleet/summary")
                    if r.status_code == 200:
                        self.summary = r.json()
                if self.service is not None:
                    self.service.poll(c)
                self.stop.wait(1.0)

    def start_service(self) -> None:
        """The inference service and its embedded gateway (``demoservice.py``)."""
        svc = DemoService(
            server_url=self.url,
            admin_token=self.token,
            host=self.opts.host,
            port=self.opts.gateway_port,
            ca_file=self.ca_file,
        )
        self.service = svc
        with self.api() as c:
            if svc.deploy(c, team=ADMIN_TEAM):
                svc.start_gateway()
                if self.opts.workload:
                    svc.start_load()

    def render(self) -> Any:
        from rich.table import Table

        s = self.summary
        t = Table(title="gpufleet demo", show_header=False, expand=False)
        t.add_column(justify="right", style="bold")
        t.add_column()
        if not s:
            t.add_row("status", "starting...")
            return t
        t.add_row("nodes ready", f"{s['nodes_ready']} / {s['nodes']}")
        t.add_row("GPUs busy", f"{s['gpus_busy']} / {s['gpus']}  ({s['gpus_unhealthy']} unhealthy)")
        jobs = s.get("jobs", {})
        order = ("PENDING", "SCHEDULED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "HELD")
        t.add_row("jobs", "  ".join(f"{k.lower()} {jobs[k]}" for k in order if jobs.get(k)) or "none yet")
        sync = s.get("sync", {})
        t.add_row("syncs", f"{sync.get('count', 0)}  p99 {sync.get('p99_ms')} ms")
        t.add_row("submitted", str(self.workload.submitted))
        if self.service is not None:
            t.add_row("service mlp", self.service.status())
        return t

    def line(self) -> str:
        s = self.summary
        if not s:
            return "gpufleet demo: starting..."
        jobs = " ".join(f"{k}={v}" for k, v in sorted(s.get("jobs", {}).items()))
        gpus = f"GPUs {s['gpus_busy']}/{s['gpus']} busy"
        return f"nodes {s['nodes_ready']}/{s['nodes']} ready, {gpus}, jobs: {jobs}"

    # -- shutdown ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        if self.service is not None:
            self.service.stop()
        for bot in self.agents:
            if bot.running():
                with contextlib.suppress(Exception):
                    bot.stop_all(timeout_s=3.0)
            with contextlib.suppress(Exception):
                bot.close()
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        if self.cleanup:
            shutil.rmtree(self.data, ignore_errors=True)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


@contextlib.contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    def handler(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _background(target: Any, *args: Any, name: str) -> threading.Thread:
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    t.start()
    return t


def _cli_path() -> str:
    """How to run ``gpufleet`` from the caller's shell: the bare name when it is on PATH,
    else the script beside this interpreter (a venv that is not activated)."""
    beside = Path(sys.executable).parent / "gpufleet"
    found = shutil.which("gpufleet")
    if found and Path(found).resolve() == beside.resolve():
        return "gpufleet"
    return str(beside) if beside.exists() else "gpufleet"


def _service_lines(svc: DemoService | None, cli: str) -> str:
    if svc is None:
        return ""
    if svc.problem:
        return f"  service  {svc.problem}\n"
    return (
        f"  service  mlp: gpufleet model-server behind the gateway {svc.url}/, autoscaled 1..4\n"
        f"           replicas with 1 warm, under a daily load curve compressed into 10 minutes\n"
        f"           ({cli} service show mlp; ready in a few seconds; KServe v2 and OpenAI /v1)\n"
        f"  call     {svc.curl()}\n"
    )


def _mig_lines(opts: DemoOptions, cli: str) -> str:
    node = opts.mig_node
    if node is None:
        return ""
    gpus = {g: p for g, p in MIG_LAYOUTS.items() if g < opts.gpus_per_node}
    sliced = [f"gpu{g} {layout_words(p)}" for g, p in gpus.items() if p]
    empty = [g for g, p in gpus.items() if not p]
    free = f"; gpu{','.join(map(str, empty))}: MIG mode on, no instance yet" if empty else ""
    asked = empty[0] if empty else next(iter(gpus))
    return (
        f"  MIG      {node}: {'; '.join(sliced)}{free}\n"
        f"           {cli} node mig {node} --gpu {asked} --layout 2g.20gb,2g.20gb,3g.40gb --wait\n"
        f"           {cli} submit --mig 1g.10gb:2 -- sh -c 'echo $CUDA_VISIBLE_DEVICES'\n"
    )


def run_demo(opts: DemoOptions) -> int:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    demo = Demo(opts)
    with _signals(demo.stop):
        try:
            problem = demo.start_server()
            if problem is not None:
                console.print(f"[red]gpufleet demo: {problem}[/red]")
                return 1
            with demo.api() as c:
                users = setup_accounts(c)
            demo.start_agents()
            if opts.service:
                demo.start_service()
            demo.threads.append(_background(demo.poll_summary, name="summary"))
            demo.threads.append(_background(demo.book_reservations, name="bookings"))
            if opts.workload:
                demo.threads.append(_background(demo.workload.run, users, name="workload"))
            cli = _cli_path()
            console.print(
                f"gpufleet demo: {opts.nodes} nodes x {opts.gpus_per_node} simulated GPUs"
                + (" (HTTPS; agents on mTLS)" if opts.tls else "")
                + "\n"
                f"  page     {demo.url}/   (sign in with the admin token)\n"
                f"  API      {demo.url}/v1   (docs: {demo.url}/docs)\n"
                f"  admin    {demo.token}\n"
                f"  data     {demo.data}{' (removed at exit)' if demo.cleanup else ''}\n"
                f"  try      export GPUFLEET_URL={demo.url} GPUFLEET_TOKEN={demo.token}"
                + (f" GPUFLEET_CA_FILE={demo.ca_file}" if demo.ca_file else "")
                + f"\n           {cli} submit -- echo hi; {cli} logs <id>\n"
                + _mig_lines(opts, cli)
                + _service_lines(demo.service, cli)
                + "  Ctrl-C stops everything.",
                highlight=False,
                soft_wrap=True,
            )
            if console.is_terminal:
                with Live(demo.render(), console=console, refresh_per_second=2) as live:
                    while not demo.stop.wait(0.5):
                        live.update(demo.render())
            else:
                while not demo.stop.wait(5.0):
                    print(demo.line(), flush=True)
        except (RuntimeError, httpx.HTTPError, OSError) as exc:
            console.print(f"[red]gpufleet demo: {exc}[/red]")
            return 1
        finally:
            demo.shutdown()
    console.print("gpufleet demo: stopped.")
    return 0


def demo_upgrade_hooks(work: Path) -> dict[str, Path]:
    """The demo's agents' upgrade hook ``driver`` (``gpufleet upgrade start --command
    driver``): a script that only prints; the simulated GPUs then report the driver the
    upgrade expected (``SimulatedProbe.upgraded``). Checked as a real agent checks its
    hooks; where the checks refuse it (a shared directory), the demo runs without one."""
    from gpufleet.agent.upgrade import HookError, parse_hooks

    hook = work / "upgrade-driver"
    try:
        work.mkdir(parents=True, exist_ok=True)
        hook.write_text('#!/bin/sh\necho "gpufleet demo: installing NVIDIA driver $1 (simulated)"\n')
        hook.chmod(0o755)
        return parse_hooks([f"driver={hook}"])
    except (OSError, HookError) as exc:
        print(f"gpufleet demo: no driver upgrade hook ({exc})", file=sys.stderr)
        return {}
