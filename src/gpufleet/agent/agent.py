"""The node agent: one per GPU server. It reconciles the jobs on its node with the
set the server wants there (DESIGN.md, "desired state down, observed state up").

Each sync sends: the GPUs (with the agent's health verdict), their telemetry, every job
attempt it holds (``running`` until every process of it is over, then ``exited`` with
the code at once, whatever is left of its log) and new log bytes (``logship``: sized
after encoding, capped per job, the rest of an ended job's log after its exit). The
reply is the desired set of (job, attempt) and how much of each log the server has.
Then, in this order:

1. release attempts reported ``exited`` that the server no longer wants (done), and
   forget them once their log is closed on the server (or ``log_tail_s`` after their end),
2. stop what is extra (SIGTERM, SIGKILL after the grace period, over later ticks),
3. start what is missing, once no attempt still stopping holds one of its GPUs.

Restart safety: every attempt is a record in the work dir (``JobStore``) written before
the agent reports it, so a restarted agent re-adopts running processes instead of
starting them twice; a lost reply just means the same message is sent again.
Between syncs, ``tick`` polls the jobs every ``tick_s``; news (a job was started or
stopped) triggers the next sync ``news_gap_s`` later instead of after
``sync_interval_s``; urgent news (a job ended, a new GPU fault) ``urgent_gap_s`` later.

Push (``server/store/dispatch.py``): where the transport can long-poll (``WaitTransport``),
a watcher thread keeps one ``GET /v1/nodes/{name}/wait`` open; an answer with a new
version means the node's desired set may have changed, and the agent syncs at once
(no gap). The periodic sync stays the safety net (a lost long-poll, a server without
the endpoint) and the liveness signal. A process the agent started kicks the loop the
moment it exits (``exits.py``), so an exit is reported within milliseconds, not at the
next tick.

sbatch's ``--signal=[B:]NAME@SECONDS``: ``tick`` sends NAME once the job's time left
(to its ``deadline``, which the server hands out once the job runs, kept up to date on
the held attempt) is at most SECONDS, through the runner (``send_signal``): to the
batch shell only with ``B:``, else to every process of the job. Once per attempt: the
record says it was sent before it is sent, so a restarted agent never sends it again
(at most once: an agent killed between the two does not send it at all).

Job steps (``srun`` inside a job, issue 31; ``agent/steps.py``): a multi-node batch job
runs its script on its first node only, the others hold its attempt; the reply's
``DesiredJob.steps`` are the step tasks to run here, started inside the job's attempt
and reported with their output in ``steps`` until the server acknowledges their exit.
Every process job gets the way back to the server (its own credential) and the Slurm
commands first on its PATH (``agent/slurmbin.py``).

Every sync also carries the node's CPUs and memory (``cpus``, ``memory_mb``: the
probe's inventory, where it knows them).

Service replicas (a ``DesiredJob.service``): the agent picks a free port of the node and
gives it as ``$PORT`` (a container's port is published on it), probes the health path
on it every ``probe_interval_s`` (2xx/3xx within ``probe_timeout_s``: ready), and
reports ``ready`` and the endpoint (``http://ADDRESS:PORT``) with the replica; a change
of readiness is news.

MIG layouts (``SyncReply.mig``, set by operators with ``gpufleet node mig``): each GPU
is reported with its MIG mode and instances. A ``MigChange`` is applied once, by a
worker thread (NVML takes seconds per instance; the loop goes on meanwhile), when no
local attempt holds that GPU (else at a later sync); its ``MigResult`` (error None:
applied) travels with every sync until the server no longer asks for that change, and
is then forgotten. A layout already applied (or failed) is never applied again while
the server asks for it; a different layout for the GPU is. See ``Agent._mig_step``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil
from pydantic import ValidationError

from gpufleet import mig
from gpufleet.agent import selfcmd
from gpufleet.agent.exits import ExitWatch
from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob
from gpufleet.agent.logship import LogLimits, cap_marker, chunks_of, pending
from gpufleet.agent.probe import (
    GpuInfo,
    GpuProbe,
    GpuSample,
    HealthTracker,
    LoadSink,
    MigInstance,
    NodeInventory,
    ProbeError,
    ProcessProbe,
)
from gpufleet.agent.replicas import ReplicaProbes, free_port
from gpufleet.agent.runners import VANISHED, JobRunner, ProcessRunner
from gpufleet.agent.slurmbin import write_launchers
from gpufleet.agent.steps import StepTasks, prepare_job
from gpufleet.agent.transport import AgentTransportError, SyncTransport, WaitTransport
from gpufleet.api.nodes import DesiredJob, MigChange, SyncReply
from gpufleet.api.steps import DesiredStep
from gpufleet.clock import Clock, SystemClock
from gpufleet.slurmopts import signal_parts

log = logging.getLogger("gpufleet.agent")
_SLEEP = shutil.which("sleep", path="/usr/bin:/bin") or "/bin/sleep"
Key = tuple[int, int]
Layout = tuple[str, ...]

NO_MIG_PROBE = "this node's GPU probe cannot change MIG layouts"
MIG_ERROR_CHARS = 512
"""``MigResult.error``'s limit: a longer message is cut, never the sync refused."""
GPU_SWEEPS = 3
"""How many ticks an ended job's leftovers on its GPUs are killed before it is reported
over regardless."""
MIG_INSTANCES_MAX = 7
"""``GpuIn.mig_instances``' limit (no GPU has more MIG devices)."""


@runtime_checkable
class MigProbe(Protocol):
    """A probe that can replace a GPU's MIG instances (``NvmlProbe``, ``SimulatedProbe``).
    A probe may also offer ``set_mig_mode(gpu_index, enabled)``; the agent uses it where
    present (see ``Agent._apply_mig_one``)."""

    def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    node: str
    work_dir: Path
    leaf: str | None = None
    rack: str | None = None
    address: str | None = None
    features: tuple[str, ...] = ()
    """Slurm's node features this node reports (``--features ib,nvme``; none: none sent)."""
    sync_interval_s: float = 10.0
    news_gap_s: float = 0.3
    """At most this often when there is news (a job started or stopped)."""
    urgent_gap_s: float = 0.02
    """At most this often when a job ended or a GPU shows a new fault (a batch of exits
    that close together shares one sync)."""
    wait_s: float = 45.0
    """How long one long-poll waits on the server before it is sent again (each time
    0.75-1.25 x this; the server takes at most 60 s). Longer: fewer renewals (1,000
    agents renew ~22 times a second at 45 s)."""
    log_gap_s: float = 2.0
    """At most this often when only new log output is waiting."""
    tick_s: float = 0.5
    grace_s: float = 30.0
    log_limits: LogLimits = dataclasses.field(default_factory=LogLimits)
    log_tail_s: float = 600.0
    """How long after a job's end the rest of its log is still shipped (a server that
    never takes it must not keep the record for ever)."""
    real_job_util: float = 0.5
    """The utilisation a simulated GPU shows while a real process holds it."""
    health_interval_s: float = 2.0
    """The GPUs are checked this often between syncs; a new fault syncs at once."""
    checkpoint_root: Path | None = None
    """Where ``checkpoints/<job>`` (GPUFLEET_CHECKPOINT_DIR) lives: a filesystem shared
    by all nodes lets a requeued job resume on another node (default: the work dir)."""
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 1.0
    mps_pipe_dir: str = ""
    """The MPS control daemon's pipe directory for GPU shares' jobs ("": CUDA's default,
    /tmp/nvidia-mps). Without a daemon there, shares run time-sliced, their limits not
    enforced (``jobs.share_env``)."""


@dataclass(slots=True)
class AgentStats:
    syncs: int = 0
    failures: int = 0
    started: int = 0
    stopped: int = 0
    last_error: str | None = None
    last_status: int | None = None


def telemetry_row(s: GpuSample, reasons: tuple[str, ...], inv: NodeInventory) -> dict[str, Any]:
    info = next((g for g in inv.gpus if g.index == s.index), None)
    row: dict[str, Any] = {
        "index": s.index,
        "utilization_pct": s.utilization_pct,
        "memory_used_mb": s.memory_used_mb,
        "temperature_c": s.temperature_c,
        "power_w": s.power_w,
        "sm_clock_mhz": s.sm_clock_mhz,
        "mem_clock_mhz": s.mem_clock_mhz,
        "throttle_reasons": list(s.throttle_reasons),
        "ecc_sbe": s.ecc_sbe,
        "ecc_dbe": s.ecc_dbe,
        "xid_events": list(s.xid_events),
        "pcie_replay": s.pcie_replay,
        "retired_pages": s.retired_pages,
        "pcie_gen": info.pcie_gen if info else None,
        "pcie_width": info.pcie_width if info else None,
        "nvlink_peers": list(info.nvlink_peers) if info else [],
        "mig_enabled": info.mig_enabled if info else None,
        "lost": s.lost,
        "health": list(reasons),
    }
    if s.mig_instances:  # only then: an older server refuses the key (extra="forbid")
        row["mig_instances"] = [dataclasses.asdict(m) for m in s.mig_instances[:7]]
    return row


def mig_instance_row(m: MigInstance) -> dict[str, Any]:
    """A MIG device as ``MigInstanceIn`` (strings cut to its limits: one odd name from a
    driver must not get the whole sync refused)."""
    return {
        "uuid": m.uuid[:96],
        "profile": m.profile[:32],
        "gpu_instance_id": m.gpu_instance_id,
        "compute_instance_id": m.compute_instance_id,
        "start": m.start,
        "size": m.size,
        "memory_mb": m.memory_mb,
    }


def gpu_row(g: GpuInfo, healthy: bool) -> dict[str, Any]:
    """A GPU of the inventory as ``GpuIn``."""
    return {
        "index": g.index,
        "uuid": g.uuid[:64],
        "model": g.model[:64],
        "memory_mb": g.memory_mb,
        "nvlink_domain": g.nvlink_domain,
        "healthy": healthy,
        "mig_enabled": g.mig_enabled,
        "mig_instances": [mig_instance_row(m) for m in g.mig_instances[:MIG_INSTANCES_MAX]],
    }


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
        self.transport = transport
        self.runners = dict(runners)
        self.store = store
        self.clock = clock or SystemClock()
        self.health = HealthTracker()
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
        self._watcher: threading.Thread | None = None
        self._last_sync = float("-inf")
        self._next_sync = 0.0
        self._lock = threading.Lock()
        self._xids: dict[int, list[int]] = {}
        self._faults: dict[int, frozenset[str]] = {}
        self._last_health = time.monotonic()
        self.replicas = ReplicaProbes(interval_s=config.probe_interval_s, timeout_s=config.probe_timeout_s)
        self._mig_results: dict[int, tuple[Layout, str | None]] = {}
        """GPU -> (layout, error) of a MIG change done, reported until the server stops asking."""
        self._mig_applying: dict[int, Layout] = {}
        """GPU -> layout the MIG worker is applying now."""
        self._mig_worker: threading.Thread | None = None
        self._skip_logs = False
        self._log_backlog = False
        """The last sync's chunks took most of its budget: more is waiting."""
        self._released: set[Key] = set()
        self._gpu_sweeps: dict[Key, int] = {}
        """Attempt -> how many times its leftovers on its GPUs were killed."""
        """The last sync was refused as too large: the next carries no log chunks."""
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
                    cur = self._signal_due(runner, cur, now)
                code = runner.poll(cur, now=now)
                if code is not None and self._gpu_leftovers(cur):
                    code = None  # killed what NVML still lists of it: over at a later tick
                if code is not None:
                    cur = dataclasses.replace(cur, exit_code=code, ended_at=now)
                    ended = True
                self._save(cur)
            if self.steps is not None and self.steps.poll(now=now, grace_s=self.config.grace_s):
                ended = True
            self._feed_probe()
            probing = [j for j in self.jobs.values() if j.port is not None and j.exit_code is None]
        if self.replicas.probe(probing, simulated=isinstance(self.probe, LoadSink)):
            self._news = True
        if ended:
            self._news = self._urgent = True
        return ended

    def _gpu_leftovers(self, job: LocalJob) -> bool:
        """On a real GPU: the processes of the job's account NVML still lists on its GPUs
        once its runner says it is over (GPUs another running attempt of that account
        holds are left alone: whose is whose cannot be told). Killed, and True: its end
        is reported at a later tick, so its GPUs are offered only once they are clear; at
        most ``GPU_SWEEPS`` times (a process that does not die must not hold the job for
        ever: a warning says so). Caller holds the lock."""
        probe = self.probe
        tries = self._gpu_sweeps.get(job.key, 0)
        if job.uid is None or not isinstance(probe, ProcessProbe) or tries >= GPU_SWEEPS:
            return False
        others = {
            mig.device_gpu(g)
            for j in self.jobs.values()
            if j.key != job.key and j.exit_code is None and j.uid == job.uid
            for g in j.gpus
        }
        found: list[int] = []
        for gpu in sorted({mig.device_gpu(g) for g in job.gpus} - others):
            for pid in probe.gpu_pids(gpu):
                with contextlib.suppress(psutil.Error, OSError):
                    if psutil.Process(pid).uids().real == job.uid:
                        os.kill(pid, signal.SIGKILL)
                        found.append(pid)
        if found:
            self._gpu_sweeps[job.key] = tries + 1
            log.warning("job %s/%s: killed pids %s left on its GPUs", job.job_id, job.attempt, found)
        else:
            self._gpu_sweeps.pop(job.key, None)
        return bool(found)

    def _signal_due(self, runner: JobRunner, job: LocalJob, now: float) -> LocalJob:
        """``--signal``: send it once the time left is at most its seconds (caller holds
        the lock)."""
        deadline = job.deadline
        if job.signal is None or deadline is None or job.signal_sent_at is not None:
            return job
        try:
            batch_only, signum, seconds = signal_parts(job.signal)
        except (KeyError, ValueError):  # not parse_signal's form: nothing to send, ever
            log.warning("job %s/%s: unusable --signal %r", job.job_id, job.attempt, job.signal)
            job = dataclasses.replace(job, signal_sent_at=now)
            self._save(job)
            return job
        if now < deadline - seconds:
            return job
        job = dataclasses.replace(job, signal_sent_at=now)
        self._save(job)  # first: a restarted agent must not send it a second time
        why = runner.send_signal(job, signum=signum, batch_only=batch_only)
        if why is not None:
            log.info("job %s/%s: --signal=%s not sent: %s", job.job_id, job.attempt, job.signal, why)
        return job

    def _refresh(self, job: LocalJob, d: DesiredJob) -> None:
        """A held attempt's ``--signal`` and deadline, as the server now says (the
        deadline arrives once the job runs, and moves when its time limit does)."""
        if job.exit_code is None and (job.signal, job.deadline) != (d.signal, d.deadline):
            self._save(dataclasses.replace(job, signal=d.signal, deadline=d.deadline))

    def _kick(self) -> None:
        self.kick.set()

    def _acked(self, reply: SyncReply, sent: dict[str, Any]) -> None:
        """How far the server has each log (caller holds the lock): the cap's marker and
        the closing chunk count once the ack reaches their end."""
        ends = {(a.job_id, a.attempt): a.end for a in reply.log_acks}
        for c in sent.get("logs", []):
            key = (c["job_id"], c["attempt"])
            job = self.jobs.get(key)
            if job is None or ends.get(key, -1) < c["end"]:
                continue
            if c.get("last") and not job.log_done:
                self._save(dataclasses.replace(job, log_done=True))
            if c["data"] == cap_marker(self.config.log_limits.max_bytes) and not job.log_capped:
                self._save(dataclasses.replace(self.jobs[key], log_capped=True))
        for key, end in ends.items():
            job = self.jobs.get(key)
            if job is not None and end > job.log_acked:
                self._save(dataclasses.replace(job, log_acked=end))

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
            self._gpu_sweeps.pop(key, None)
            self.store.forget(job)

    def endpoint(self, job: LocalJob) -> str:
        host = self.config.address or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        return f"http://{host}:{job.port}"

    def _feed_probe(self) -> None:
        if not isinstance(self.probe, LoadSink):
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
        self.probe.set_load(load)

    def running(self) -> list[LocalJob]:
        return [j for j in self.jobs.values() if j.exit_code is None]

    # -- one sync ---------------------------------------------------------------------------
    def build_sync(self) -> dict[str, Any]:
        inv = self.inventory
        try:
            samples = self._with_xids(self.probe.sample())
        except ProbeError as exc:
            log.warning("node %s: no telemetry: %s", self.config.node, exc)
            samples = ()
        verdicts = self.health.update(samples)
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
            mig_results = [
                {"gpu": gpu, "layout": list(layout), "error": error}
                for gpu, (layout, error) in sorted(self._mig_results.items())
            ]
        self._log_backlog = budget < self.config.log_limits.sync_bytes // (2 * self._log_shrink)
        body: dict[str, Any] = {"gpus": gpus, "telemetry": telemetry, "jobs": jobs, "logs": logs}
        if self.steps is not None:
            with self._lock:
                tasks = self.steps.report()
            if tasks:  # only then: an older server refuses the key
                body["steps"] = tasks
        if mig_results:
            body["mig_results"] = mig_results
        for k in ("leaf", "rack", "address"):
            v = getattr(self.config, k)
            if v:
                body[k] = v
        if self.config.features:
            body["features"] = list(self.config.features)
        if inv.driver_version:
            body["driver_version"] = inv.driver_version[:64]
        if inv.cuda_version:
            body["cuda_version"] = inv.cuda_version[:32]
        if inv.cpus is not None:
            body["cpus"] = inv.cpus
        if inv.memory_mb is not None:
            body["memory_mb"] = inv.memory_mb
        warning = self.warning()
        if warning:
            body["warning"] = warning[:512]
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
            self._mig_step(parsed.mig)

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
        """``JobSpec.devices`` for these indices: () for whole GPUs; for MIG slices their
        ``MIG-...`` UUIDs from the inventory (the GPU and first memory slice an index
        names), None when one is not there (the layout changed under the allocation)."""
        if all(mig.slice_of(i) is None and mig.share_of(i) is None for i in gpus):
            return ()
        out: list[str] = []
        for i in gpus:
            share = mig.share_of(i)
            if share is not None:  # a GPU share: its GPU, once
                if str(share[0]) not in out:
                    out.append(str(share[0]))
                continue
            where = mig.slice_of(i)
            if where is None:
                out.append(str(i))
                continue
            info = next((g for g in self.inventory.gpus if g.index == where[0]), None)
            found = (
                None if info is None else next((m for m in info.mig_instances if m.start == where[1]), None)
            )
            if found is None:
                log.warning("node %s: no MIG instance at GPU %d slice %d", self.config.node, *where)
                return None
            out.append(found.uuid)
        return tuple(out)

    def _share(self, gpus: Sequence[int]) -> tuple[int, int] | None:
        """``JobSpec.share`` for these indices: (percent, MiB) of a GPU share's units, the
        memory the units' share of the GPU's (None: not a share)."""
        units = [s for s in map(mig.share_of, gpus) if s is not None]
        if not units:
            return None
        info = next((g for g in self.inventory.gpus if g.index == units[0][0]), None)
        memory = 0 if info is None else info.memory_mb
        return len(units), memory * len(units) // mig.SHARE_UNITS

    # -- MIG layouts ------------------------------------------------------------------------
    def _mig_step(self, changes: Sequence[MigChange]) -> None:
        """Act on the reply's MIG changes (caller holds the lock): forget the results the
        server no longer asks for, then hand the changes not yet done, on GPUs no local
        attempt holds, to a worker thread. One worker at a time: a change that arrives
        while it runs waits for the next sync (the worker's end triggers one).

        Never twice: a change with a result (applied or failed) is not applied again while
        the server asks for it. Results live in memory: an agent restarted before it
        reported one applies that layout once more (no job is on the GPU then)."""
        wanted: dict[int, Layout] = {c.gpu: tuple(c.layout) for c in changes}
        for gpu, (layout, _) in list(self._mig_results.items()):
            if wanted.get(gpu) != layout:
                del self._mig_results[gpu]
        busy = {mig.device_gpu(g) for j in self.jobs.values() if j.exit_code is None for g in j.gpus}
        todo = [
            (gpu, layout)
            for gpu, layout in sorted(wanted.items())
            if gpu not in self._mig_applying
            and self._mig_results.get(gpu, (None, None))[0] != layout
            and gpu not in busy
        ]
        if not todo or self._mig_applying:
            return
        if not isinstance(self.probe, MigProbe):
            for gpu, layout in todo:
                self._mig_results[gpu] = (layout, NO_MIG_PROBE)
            self._news = True
            return
        self._mig_applying = dict(todo)
        self._mig_worker = threading.Thread(
            target=self._apply_mig, args=(todo,), name=f"gpufleet-mig-{self.config.node}", daemon=True
        )
        self._mig_worker.start()

    def _apply_mig(self, todo: Sequence[tuple[int, Layout]]) -> None:
        """The MIG worker: apply each change, re-read the inventory (a failed change may
        have done part of its work: the next sync shows what the GPU holds), record the
        result and sync soon. Any exception is the change's error, never the worker's end."""
        for gpu, layout in todo:
            try:
                error = self._apply_mig_one(gpu, layout)
            except ProbeError as exc:
                error = str(exc) or type(exc).__name__
            except Exception as exc:
                log.exception("node %s: MIG layout for GPU %d failed", self.config.node, gpu)
                error = f"{type(exc).__name__}: {exc}"
            try:
                self.inventory = self.probe.inventory()
            except Exception as exc:
                log.warning("node %s: inventory after a MIG change: %s", self.config.node, exc)
            if error is not None:
                log.warning(
                    "node %s: MIG layout %s on GPU %d: %s", self.config.node, ",".join(layout), gpu, error
                )
            with self._lock:
                self._mig_applying.pop(gpu, None)
                self._mig_results[gpu] = (layout, None if error is None else error[:MIG_ERROR_CHARS])
                self._news = self._urgent = True
            self._kick()

    def _apply_mig_one(self, gpu: int, layout: Layout) -> str | None:
        """One change: None once applied, else why not (``MigError``s propagate).

        A layout: ``apply_mig_layout`` (which refuses a GPU in MIG mode off; a probe with
        ``set_mig_mode`` turns it on first). The whole GPU (``[]``): a GPU whose MIG mode is
        off (or not reported) is whole already; else its instances are removed and, with
        ``set_mig_mode``, MIG mode is turned off. Without it that is an error telling the
        operator what is left to do (NVML turns MIG mode off only across a GPU reset, and
        a GPU in MIG mode with no instance is no whole GPU to CUDA)."""
        probe = self.probe
        if not isinstance(probe, MigProbe):
            return NO_MIG_PROBE
        set_mode = getattr(probe, "set_mig_mode", None)
        info = next((g for g in self.inventory.gpus if g.index == gpu), None)
        mig_on = info is not None and bool(info.mig_enabled)
        if layout:
            if set_mode is not None and info is not None and not mig_on:
                set_mode(gpu, True)
            probe.apply_mig_layout(gpu, list(layout))
            return None
        if info is not None and not mig_on:
            return None
        probe.apply_mig_layout(gpu, [])
        if set_mode is not None:
            set_mode(gpu, False)
            return None
        return (
            f"GPU {gpu}: MIG instances removed, but MIG mode is still on and this node's probe cannot "
            f"turn it off: run nvidia-smi -i {gpu} -mig 0 (needs a GPU reset)"
        )

    def mig_settle(self, timeout_s: float = 10.0) -> bool:
        """Wait until no MIG change is being applied; True if none is (tests, shutdown)."""
        worker = self._mig_worker
        if worker is not None:
            worker.join(timeout_s)
        return not self._mig_applying

    def sync_once(self) -> bool:
        body = self.build_sync()
        self._news = self._urgent = self._pushed = False
        self._last_sync = time.monotonic()
        try:
            reply = self.transport.sync(self.config.node, body)
            self.apply(reply, sent=body)
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

    def _with_xids(self, samples: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
        """The samples with the XIDs seen by health checks since the last sync."""
        if not self._xids:
            return samples
        xids, self._xids = self._xids, {}
        return tuple(
            dataclasses.replace(s, xid_events=(*xids.get(s.index, ()), *s.xid_events)) for s in samples
        )

    def check_health(self) -> bool:
        """Sample the GPUs between syncs; True (and a sync soon) if a GPU shows a new
        kind of fault. XIDs seen here travel with the next sync."""
        try:
            samples = self.probe.sample()
        except ProbeError:
            return False
        for s in samples:
            if s.xid_events:
                self._xids.setdefault(s.index, []).extend(s.xid_events)
        faults = {
            i: frozenset(r.split()[0] for r in v.reasons) for i, v in self.health.update(samples).items()
        }
        new = any(not f <= self._faults.get(i, frozenset()) for i, f in faults.items())
        self._faults = faults
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
        """Keep a long-poll open until ``stop`` (where the transport can)."""
        waiter = self.transport
        if self._watcher is not None or not isinstance(waiter, WaitTransport):
            return
        self._watcher = threading.Thread(
            target=self._watch, args=(waiter, stop), name=f"gpufleet-wait-{self.config.node}", daemon=True
        )
        self._watcher.start()

    def _watch(self, waiter: WaitTransport, stop: threading.Event) -> None:
        seen: str | None = None
        failures = 0
        while not stop.is_set():
            try:
                # a random timeout spreads the renewals of a whole fleet's long-polls (after a
                # server restart they would all come at once); Kubernetes' watches do the same
                timeout = self.config.wait_s * random.uniform(0.75, 1.25)
                version = waiter.wait(self.config.node, seen, timeout)
            except AgentTransportError as exc:
                if exc.status in (404, 405):
                    log.info("node %s: the server has no long-poll: periodic syncs only", self.config.node)
                    return
                failures += 1  # down, restarting, or refusing us: the periodic sync says which
                stop.wait(min(self.config.sync_interval_s, 0.5 * 2 ** min(failures, 6)))
                continue
            except Exception:  # never die: the periodic sync carries on regardless
                log.exception("node %s: long-poll failed", self.config.node)
                failures += 1
                stop.wait(min(self.config.sync_interval_s, 0.5 * 2 ** min(failures, 6)))
                continue
            failures = 0
            if version != seen:  # the first answer too: something may have changed since our last sync
                seen = version
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
