"""The node agent: one per GPU server. It reconciles the jobs on its node with the
set the server wants there (DESIGN.md, "desired state down, observed state up").
``Agent`` is the conductor; each part it drives lives in its own module.

Each sync sends: the GPUs (with the agent's health verdict), their telemetry and the
node's facts (``report.py``), every job attempt it holds (``running`` until every
process of it is over, then ``exited`` with the code at once, whatever is left of its
log) and new log bytes (``logship``: sized after encoding, capped per job, the rest of
an ended job's log after its exit). The reply is the desired set of (job, attempt) and
how much of each log the server has. Then, in this order:

1. release attempts reported ``exited`` that the server no longer wants (done), and
   forget them once their log is closed on the server (or ``log_tail_s`` after their end),
2. stop what is extra (SIGTERM, SIGKILL after the grace period, over later ticks),
3. start what is missing, once no attempt still stopping holds one of its GPUs.

Restart safety: every attempt is a record in the work dir (``JobStore``) written before
the agent reports it, so a restarted agent re-adopts running processes instead of
starting them twice; a lost reply just means the same message is sent again.
Between syncs, ``tick`` polls the jobs every ``tick_s``, sends sbatch's ``--signal``
when due (``jobsignal.py``) and kills what an ended job left on its GPUs
(``gpusweep.py``); news (a job was started or stopped) triggers the next sync
``news_gap_s`` later instead of after ``sync_interval_s``; urgent news (a job ended, a
new GPU fault) ``urgent_gap_s`` later.

Push: where the transport can long-poll, the doorbell (``doorbell.py``) rings when the
node's desired set may have changed, and the agent syncs at once (no gap); the periodic
sync stays the safety net and the liveness signal (an idle node's is a lease renewal
while it has nothing new to say: ``renewal.py``). A process the agent started kicks
the loop the moment it exits (``exits.py``), so an exit is reported within
milliseconds, not at the next tick.

Job steps (``srun`` inside a job, issue 31; ``agent/steps.py``): a multi-node batch job
runs its script on its first node only, the others hold its attempt; the reply's
``DesiredJob.steps`` are the step tasks to run here, started inside the job's attempt
and reported with their output in ``steps`` until the server acknowledges their exit.
Every process job gets the way back to the server (its own credential) and the Slurm
commands first on its PATH (``agent/slurmbin.py``). A job's GPU indices become the
devices it is started on (``devices.py``: MIG slices, GPU shares).

Service replicas (a ``DesiredJob.service``): the agent picks a free port of the node and
gives it as ``$PORT`` (a container's port is published on it), probes the health path
on it every ``probe_interval_s`` (2xx/3xx within ``probe_timeout_s``: ready), and
reports ``ready`` and the endpoint (``http://ADDRESS:PORT``) with the replica; a change
of readiness is news.

MIG layouts (``SyncReply.mig``): applied once each by a worker thread when no local
attempt holds the GPU, their results reported until the server stops asking
(``miglayouts.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet import mig
from gpufleet.agent import selfcmd
from gpufleet.agent.config import AgentConfig, AgentStats
from gpufleet.agent.devices import job_devices, job_share
from gpufleet.agent.doorbell import Doorbell
from gpufleet.agent.exits import ExitWatch
from gpufleet.agent.gpusweep import GpuSweeps
from gpufleet.agent.healthwatch import HealthWatch
from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob
from gpufleet.agent.jobsignal import signal_due
from gpufleet.agent.logship import acked, chunks_of, pending
from gpufleet.agent.miglayouts import MigLayouts
from gpufleet.agent.preflight import Finding, PreflightLimits, run
from gpufleet.agent.probe import GpuProbe, LoadSink, NodeInventory, ProbeError
from gpufleet.agent.renewal import Renewals, renewed
from gpufleet.agent.replicas import ReplicaProbes, free_port
from gpufleet.agent.report import gpu_row, node_facts, telemetry_row
from gpufleet.agent.runners import VANISHED, JobRunner, ProcessRunner
from gpufleet.agent.slurmbin import write_launchers
from gpufleet.agent.steps import StepTasks, prepare_job
from gpufleet.agent.transport import AgentTransportError, SyncTransport
from gpufleet.agent.upgrade import Upgrades
from gpufleet.api.nodes import DesiredJob, SyncReply
from gpufleet.api.steps import DesiredStep
from gpufleet.clock import Clock, SystemClock

log = logging.getLogger("gpufleet.agent")
_SLEEP = shutil.which("sleep", path="/usr/bin:/bin") or "/bin/sleep"
Key = tuple[int, int]


class Agent:
    def __init__(
        self,
        *,
        config: AgentConfig,
        probe: GpuProbe,
        transport: SyncTransport,
        runners: Mapping[str, JobRunner],
        store: JobStore,
        clock: Clock | None = None,
        warning: Callable[[], str | None] | None = None,
    ) -> None:
        self.config = config
        self.warning = warning or (lambda: None)
        """What this node cannot enforce (``Cgroups.disabled_reason``), sent with every
        sync: the page and ``gpufleet nodes`` show it."""
        self.probe = probe
        self._sink_of: object = None
        self._sink: LoadSink | None = None
        self.transport = transport
        self.runners = dict(runners)
        self.store = store
        self.clock = clock or SystemClock()
        self.watch = HealthWatch(probe)  # the GPUs between syncs (healthwatch.py)
        self.inventory = probe.inventory()
        self.jobs: dict[Key, LocalJob] = {}
        self.stats = AgentStats()
        self._news = True
        self._urgent = False
        self._pushed = False
        self.kick = threading.Event()
        """Set to run the loop's next turn now (a push, an exit); the demo shares one
        Event between the agents one of its threads runs."""
        self._exits = ExitWatch(self._kick)
        self.doorbell = Doorbell(
            node=config.node, wait_s=config.wait_s, retry_max_s=config.sync_interval_s, ring=self._ring
        )
        self._last_sync = float("-inf")
        self._next_sync = 0.0
        self._lock = threading.Lock()
        self._last_health = time.monotonic()
        self.replicas = ReplicaProbes(interval_s=config.probe_interval_s, timeout_s=config.probe_timeout_s)
        self.migs = MigLayouts(
            node=config.node, lock=self._lock, inventory=lambda: self.inventory, applied=self._mig_applied
        )
        self.upgrades = Upgrades.of(config, probe, done=self._upgrade_news)  # driver upgrades (upgrade.py)
        self.renewals = Renewals()  # an idle node's lease (renewal.py)
        self._skip_logs = False
        """The last sync was refused as too large: the next carries no log chunks."""
        self._log_backlog = False
        """The last sync's chunks took most of its budget: more is waiting."""
        self._released: set[Key] = set()
        self._sweeps = GpuSweeps()
        self._log_shrink = 1
        """Divides the log budget after a refusal (413), back to 1 after good syncs."""
        self._slurm_bin = ""
        """The Slurm launchers on every process job's PATH (``slurmbin.py``; "": none)."""
        try:
            self._slurm_bin = str(write_launchers(Path(config.work_dir)))
        except OSError as exc:
            log.warning("node %s: no Slurm commands for jobs: %s", config.node, exc)
        process = self.runners.get("process")
        self.steps: StepTasks | None = None
        """Job step tasks (``srun``, ``agent/steps.py``): process jobs' only."""
        if isinstance(process, ProcessRunner):
            work = Path(config.work_dir)
            self.steps = StepTasks(work_dir=work, node=config.node, runner=process, watch=self._exits.watch)
        self.preflight_report: dict[str, Any] | None = None  # sent until a sync is answered
        self.run_preflight()

    def run_preflight(self, limits: PreflightLimits = PreflightLimits()) -> list[Finding]:
        """Check the node (at start, after an upgrade): the server cordons it on a fatal finding."""
        found, self.preflight_report = run(self.probe, self.config.node, self.clock.now(), limits)
        self._news = self._urgent = True
        return found

    # -- local state ------------------------------------------------------------------------
    def restore(self) -> int:
        """Re-adopt the attempts recorded in the work dir (after a restart)."""
        for job in self.store.load_all():
            runner = self.runners.get(job.kind)
            if runner is not None:
                job = runner.recover(job)
                self._save(job)
                if job.pid is not None and job.kind == "process" and job.exit_code is None:
                    self._exits.watch(job.pid)
        self.tick()
        return len(self.jobs)

    def _save(self, job: LocalJob) -> None:
        if self.jobs.get(job.key) != job:
            self.store.save(job)
            self.jobs[job.key] = job

    def runner_kind(self, spec: JobSpec) -> str:
        if spec.image:
            return "container"
        if spec.simulate_s is not None:
            return "simulated"
        return "process"

    def tick(self) -> bool:
        """Poll every held attempt, step the stops; True if one ended."""
        now = self.clock.now()
        ended = False
        with self._lock:
            for job in list(self.jobs.values()):
                if job.exit_code is not None:
                    continue
                runner = self.runners[job.kind]
                cur = job
                if cur.stop_requested_at is not None:
                    cur = runner.stop(cur, now=now, grace_s=self.config.grace_s)
                else:
                    cur = signal_due(runner, cur, now, save=self._save)
                code = runner.poll(cur, now=now)
                if code is not None and self._sweeps.sweep(cur, held=self.jobs.values(), probe=self.probe):
                    code = None  # killed what NVML still lists of it: over at a later tick
                if code is not None:
                    cur = dataclasses.replace(cur, exit_code=code, ended_at=now)
                    ended = True
                self._save(cur)
            if self.steps is not None and self.steps.poll(now=now, grace_s=self.config.grace_s):
                ended = True
            self._feed_probe()
            probing = [j for j in self.jobs.values() if j.port is not None and j.exit_code is None]
        if self.replicas.probe(probing, simulated=self._load_sink() is not None):
            self._news = True
        if ended:
            self._news = self._urgent = True
        return ended

    def _refresh(self, job: LocalJob, d: DesiredJob) -> None:
        """A held attempt's ``--signal`` and deadline, as the server now says (the
        deadline arrives once the job runs, and moves when its time limit does)."""
        if job.exit_code is None and (job.signal, job.deadline) != (d.signal, d.deadline):
            self._save(dataclasses.replace(job, signal=d.signal, deadline=d.deadline))

    def _kick(self) -> None:
        self.kick.set()

    def _acked(self, reply: SyncReply, sent: dict[str, Any]) -> None:
        """How far the server has each log (caller holds the lock; ``logship.acked``)."""
        ends = {(a.job_id, a.attempt): a.end for a in reply.log_acks}
        for job in acked(self.jobs, ends, sent.get("logs", []), self.config.log_limits).values():
            self._save(job)

    def _release(self, key: Key, now: float) -> None:
        """An attempt over, reported and no longer wanted: its runner lets go of it; the
        record is forgotten once its log is closed on the server, or ``log_tail_s``
        after its end (caller holds the lock)."""
        job = self.jobs.get(key)
        if job is None:
            return
        if key not in self._released:
            self._released.add(key)
            self.runners[job.kind].release(job)
        ended = job.ended_at if job.ended_at is not None else now
        if job.log_done or now - ended >= self.config.log_tail_s:
            self.jobs.pop(key, None)
            self._released.discard(key)
            self._sweeps.forget(key)
            self.store.forget(job)

    def endpoint(self, job: LocalJob) -> str:
        host = self.config.address or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        return f"http://{host}:{job.port}"

    def _load_sink(self) -> LoadSink | None:
        """The probe as a ``LoadSink`` (the simulated one), or None. Asked twice a tick:
        ``isinstance`` on a runtime-checkable protocol walks its members every time (about
        10 us), so the answer is kept for as long as the probe is the same object."""
        probe = self.probe
        if probe is not self._sink_of:
            self._sink_of = probe
            self._sink = probe if isinstance(probe, LoadSink) else None
        return self._sink

    def _feed_probe(self) -> None:
        sink = self._load_sink()
        if sink is None:
            return
        load: dict[int, float] = {}
        for job in self.jobs.values():
            if job.exit_code is None:
                util = job.util if job.kind == "simulated" else self.config.real_job_util
                busy = self.replicas.util(job.key)
                if busy is not None:
                    util = busy  # a replica: as busy as its model server says it is
                for g in job.gpus:  # a MIG slice loads its GPU
                    gpu = mig.device_gpu(g)
                    load[gpu] = max(load.get(gpu, 0.0), util)
        sink.set_load(load)

    def running(self) -> list[LocalJob]:
        return [j for j in self.jobs.values() if j.exit_code is None]

    # -- one sync ---------------------------------------------------------------------------
    def build_sync(self) -> dict[str, Any]:
        inv = self.inventory
        try:
            raw = self.probe.sample()
        except ProbeError as exc:
            log.warning("node %s: no telemetry: %s", self.config.node, exc)
            raw = ()
        samples, verdicts = self.watch.for_sync(raw)
        gpus = [gpu_row(g, verdicts[g.index].healthy if g.index in verdicts else True) for g in inv.gpus]
        telemetry = [
            telemetry_row(s, verdicts[s.index].reasons if s.index in verdicts else (), inv) for s in samples
        ]
        jobs: list[dict[str, Any]] = []
        logs: list[dict[str, Any]] = []
        budget = 0 if self._skip_logs else self.config.log_limits.sync_bytes // self._log_shrink
        with self._lock:
            # ended first: each gets a chunk, with which its exit is reported at once
            for job in sorted(self.jobs.values(), key=lambda j: (j.exit_code is None, j.key)):
                skip = self._skip_logs and (job.exit_code is None or job.exit_reported)
                # a refused body's next sync: no logs, but 1 KiB of an ended job's, with its exit
                chunks, cost = ([], 0) if skip else chunks_of(job, self.config.log_limits, budget)
                budget = max(0, budget - cost)
                logs.extend(chunks)
                done = job.exit_code is not None and (bool(chunks) or job.exit_reported or job.log_done)
                seen: dict[str, Any] = {
                    "job_id": job.job_id,
                    "attempt": job.attempt,
                    "state": ("lost" if job.exit_code == VANISHED else "exited") if done else "running",
                    "exit_code": job.exit_code if done else None,
                }
                if job.port is not None and job.exit_code is None:
                    seen["endpoint"] = self.endpoint(job)
                    seen["ready"] = self.replicas.ready(job.key)
                    models = self.replicas.models.seen(job.key)  # issue 30 (agent/replicamodels.py)
                    if models is not None:
                        seen["models"] = models
                if job.key not in self._released:  # released: only the rest of its log
                    jobs.append(seen)
            mig_results = self.migs.report()
        self._log_backlog = budget < self.config.log_limits.sync_bytes // (2 * self._log_shrink)
        body: dict[str, Any] = {"gpus": gpus, "telemetry": telemetry, "jobs": jobs, "logs": logs}
        if self.steps is not None:
            with self._lock:
                tasks = self.steps.report()
            if tasks:  # only then: an older server refuses the key
                body["steps"] = tasks
        if mig_results:
            body["mig_results"] = mig_results
        body.update(node_facts(self.config, inv, self.warning()))
        upgrade = self.upgrades.report()
        if upgrade is not None:  # only then: an older server refuses the key
            body["upgrade"] = upgrade
        if self.preflight_report is not None:
            body["preflight"] = self.preflight_report
        return body

    def apply(self, reply: dict[str, Any], *, sent: dict[str, Any]) -> None:
        parsed = SyncReply.model_validate(reply)
        desired = {(d.job_id, d.attempt): d for d in parsed.jobs}
        now = self.clock.now()
        with self._lock:
            self._acked(parsed, sent)
            reported_done = {
                (j["job_id"], j["attempt"]) for j in sent.get("jobs", []) if j["state"] in ("exited", "lost")
            }
            for key in reported_done:
                job = self.jobs.get(key)
                if job is not None and not job.exit_reported:
                    self._save(dataclasses.replace(job, exit_reported=True))
            for key in (reported_done - set(desired)) | self._released:
                self._release(key, now)
            for key, job in list(self.jobs.items()):  # 1. stop what is extra, first
                if key not in desired and job.exit_code is None and job.stop_requested_at is None:
                    self._save(self.runners[job.kind].stop(job, now=now, grace_s=self.config.grace_s))
                    self.stats.stopped += 1
                    self._news = True
            busy = {g for j in self.jobs.values() if j.exit_code is None for g in j.gpus}
            for key, d in desired.items():  # 2. then start what is missing
                if key in self.jobs:
                    self._refresh(self.jobs[key], d)
                    continue
                spec = JobSpec.from_desired(d)
                if busy & set(spec.gpus):
                    continue  # an attempt still stopping holds its GPUs: next time
                devices = self._devices(spec.gpus)
                if devices is None:
                    continue  # a MIG slice it was given is not (or no longer) here: logged
                spec = dataclasses.replace(
                    spec, devices=devices, share=self._share(spec.gpus), mps_pipe_dir=self.config.mps_pipe_dir
                )
                kind = self.runner_kind(spec)
                runner = self.runners.get(kind)
                if runner is None:
                    continue
                spec = self._prepare(spec, kind, service=d.service is not None)
                port = None
                if d.service is not None:
                    port = free_port()
                    extra = {"PORT": str(port), "GPUFLEET_HOST_PORT": str(port)}
                    spec = dataclasses.replace(spec, env={**spec.env, **extra})
                    if kind == "process":  # a replica's ``gpufleet``: this node's (``selfcmd``)
                        spec = selfcmd.resolve(spec, as_other_account=os.geteuid() == 0)
                job = runner.start(spec, now=now)
                if job.exit_code is None:
                    job = dataclasses.replace(job, signal=spec.signal, deadline=spec.deadline)
                if job.pid is not None and job.kind == "process":
                    self._exits.watch(job.pid)
                if d.service is not None:
                    job = dataclasses.replace(job, port=port, health_path=d.service.health_path)
                self._save(job)
                busy |= set(spec.gpus)
                self.stats.started += 1
                self._news = True
            self._step_tasks(parsed, now, sent)
            self.replicas.models.want(  # the services' wished models (agent/replicamodels.py)
                {k: d.service.models for k, d in desired.items() if d.service is not None},
                serving=[k for k in self.jobs if self.replicas.ready(k)],
            )
            self._feed_probe()
            busy_gpus = {mig.device_gpu(g) for j in self.jobs.values() if j.exit_code is None for g in j.gpus}
            if self.migs.step(parsed.mig, probe=self.probe, busy=busy_gpus):
                self._news = True
            if self.upgrades.step(parsed.upgrade):
                self._news = True

    def _prepare(self, spec: JobSpec, kind: str, *, service: bool) -> JobSpec:
        """``steps.prepare_job`` with this agent's server and launchers."""
        return prepare_job(
            spec,
            kind=kind,
            service=service,
            server_url=getattr(self.transport, "url", "") or "",
            ca_file=getattr(self.transport, "ca_file", "") or "",
            slurm_bin=self._slurm_bin,
            sleep=_SLEEP,
        )

    def _step_tasks(self, parsed: SyncReply, now: float, sent: dict[str, Any]) -> None:
        """The reply's step tasks (caller holds the lock): acknowledged ones forgotten,
        missing ones started, unwanted ones stopped (``agent/steps.py``)."""
        if self.steps is None:
            return
        self.steps.acked(parsed.step_acks, sent=sent.get("steps", []))
        wanted: list[tuple[JobSpec, DesiredStep]] = []
        for d in parsed.jobs:
            if d.steps:
                spec = JobSpec.from_desired(d)
                spec = dataclasses.replace(spec, devices=self._devices(spec.gpus) or ())
                spec = self._prepare(spec, "process", service=False)
                wanted.extend((spec, st) for st in d.steps)
        if self.steps.apply(wanted, self.jobs, now=now, grace_s=self.config.grace_s):
            self._news = True

    def _devices(self, gpus: Sequence[int]) -> tuple[str, ...] | None:
        """``JobSpec.devices`` for these indices on this node (``devices.job_devices``)."""
        return job_devices(self.inventory, gpus, node=self.config.node)

    def _share(self, gpus: Sequence[int]) -> tuple[int, int] | None:
        """``JobSpec.share`` for these indices on this node (``devices.job_share``)."""
        return job_share(self.inventory, gpus)

    # -- MIG layouts ------------------------------------------------------------------------
    def _mig_applied(self, inventory: NodeInventory | None) -> None:
        """A MIG change is done (the lock held): the inventory as it is now, and a sync soon."""
        if inventory is not None:
            self.inventory = inventory
        self._news = self._urgent = True
        self._kick()

    def _upgrade_news(self, inventory: NodeInventory | None) -> None:
        """An upgrade moved on (its worker): sync soon; once verified (``inventory`` read
        afresh: the driver changed), run the preflight too, where this agent has one."""
        if inventory is not None:
            with self._lock:
                self.inventory = inventory
            if callable(after := getattr(self, "run_preflight", None)):
                after()
        self._news = self._urgent = True
        self._kick()

    def mig_settle(self, timeout_s: float = 10.0) -> bool:
        """Wait until no MIG change is being applied; True if none is (tests, shutdown)."""
        return self.migs.settle(timeout_s)

    def sync_once(self) -> bool:
        quiet = not (self._news or self._urgent or self._pushed)  # else a full sync (renewal.py)
        # a push from here on asks for the next sync: its cause may come after this body is
        # built (the first long-poll of a new agent answers while its first sync is built)
        self._pushed = False
        body = self.build_sync()
        self._news = self._urgent = False
        self._last_sync = time.monotonic()
        try:
            if quiet and renewed(self.renewals, self.transport, self.config.node, body):
                self.stats.renewals += 1
                self.stats.last_error = None
                return True
            reply = self.transport.sync(self.config.node, body)
            self.apply(reply, sent=body)
            self.renewals.granted(body, reply.get("lease"))
        except AgentTransportError as exc:
            self.stats.failures += 1
            self.stats.last_error, self.stats.last_status = str(exc), exc.status
            self._news = True
            if exc.status == 413:  # never the same body again: none of its logs, then smaller
                self._skip_logs = bool(body.get("logs"))
                self._log_shrink = min(64, self._log_shrink * 4)
            log.warning("node %s: %s", self.config.node, exc)
            return False
        except ValueError as exc:  # a reply that is not a SyncReply
            self.stats.failures += 1
            self.stats.last_error = f"bad reply: {_brief(exc)}"
            log.warning("node %s: bad sync reply: %s", self.config.node, _brief(exc))
            return False
        self.stats.syncs += 1
        self.stats.last_error = None
        if body.get("preflight") is self.preflight_report:  # delivered (a newer one waits)
            self.preflight_report = None
        if self._skip_logs:
            self._skip_logs = False
        elif body.get("logs"):
            self._log_shrink = max(1, self._log_shrink // 2)
        return True

    def _pending_logs(self) -> bool:
        return any(pending(j) for j in self.jobs.values())

    def due(self, now_mono: float) -> bool:
        since = now_mono - self._last_sync
        if now_mono >= self._next_sync or self._pushed:
            return True
        if self._urgent:
            return since >= self.config.urgent_gap_s
        if self.steps is not None and self.steps.pending():  # srun waits on it
            return since >= self.config.urgent_gap_s
        if self._news or self._log_backlog:  # a backlog of log: as often as news
            return since >= self.config.news_gap_s
        return since >= self.config.log_gap_s and self._pending_logs()

    def check_health(self) -> bool:
        """Sample the GPUs between syncs; True (and a sync soon) if a GPU shows a new
        kind of fault (``healthwatch.py``)."""
        new = self.watch.check()
        if new:
            self._news = self._urgent = True
        return new

    def step(self) -> None:
        """One turn of the loop: tick, check the GPUs every ``health_interval_s``, and
        sync when due."""
        self.tick()
        now = time.monotonic()
        if now - self._last_health >= self.config.health_interval_s:
            self._last_health = now
            self.check_health()
        if self.due(now):
            ok = self.sync_once()
            back_off = min(self.config.sync_interval_s, 2.0 * max(1, self.stats.failures))
            self._next_sync = now + (self.config.sync_interval_s if ok else back_off)

    def run(self, stop: threading.Event) -> None:
        self.start_watch(stop)
        threading.Thread(target=self._kick_on, args=(stop,), daemon=True).start()
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # never die on one bad turn: log it and go on
                log.exception("node %s: agent step failed", self.config.node)
            self.kick.wait(self.config.tick_s)
            self.kick.clear()

    def _kick_on(self, stop: threading.Event) -> None:
        stop.wait()
        self._kick()

    def start_watch(self, stop: threading.Event) -> None:
        """Keep a long-poll open until ``stop`` (where the transport can; ``doorbell.py``)."""
        self.doorbell.start(self.transport, stop)

    def _ring(self) -> None:
        """The doorbell: the desired set may have changed, sync now."""
        self._pushed = True
        self._kick()

    def stop_all(self, *, timeout_s: float | None = None) -> None:
        """Stop every job this agent runs (the demo's shutdown; a real agent leaves its
        jobs running across its own restarts)."""
        grace = self.config.grace_s if timeout_s is None else timeout_s
        now = self.clock.now()
        with self._lock:
            for job in self.running():
                self._save(self.runners[job.kind].stop(job, now=now, grace_s=grace))
        if self.steps is not None:
            with self._lock:
                self.steps.stop_all()
        deadline = time.monotonic() + grace + 2.0
        while self.running() and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the helpers; a MIG change being applied may finish first (within 30 s:
        one cut short by NVML's shutdown would leave a partial layout)."""
        self.mig_settle(timeout_s=30.0)
        self._exits.close()
        self.probe.close()
        self.transport.close()
        self.replicas.close()


def _brief(exc: ValueError) -> str:
    """A bad reply's error without the values in it: a reply carries jobs' ``env``,
    which must not reach a log (pydantic quotes the offending input)."""
    if isinstance(exc, ValidationError):
        where = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors(include_input=False)[:5])
        return f"{exc.error_count()} schema errors ({where})"
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
