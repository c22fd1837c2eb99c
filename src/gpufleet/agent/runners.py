"""Job runners: how a job attempt is started, watched and stopped on this node.

``JobRunner`` is the seam; the agent picks one per job: ``ContainerRunner`` when the job
has an image (``container.py``), ``SimulatedRunner`` when it carries
``GPUFLEET_SIMULATE_S``, else ``ProcessRunner``. Runners never raise for a job that
cannot start: they return it already exited (127 and a line in its log) instead.

Stopping is a step function the agent calls every tick until the job is gone: the
first call sends SIGTERM, a call ``grace_s`` after it SIGKILL (cancel, preemption and
time limit all come as "no longer desired").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol

import psutil

from gpufleet.agent.cgroups import Cgroups, Limits
from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob, hostfile_text, launch_env
from gpufleet.agent.users import REFUSED, PosixAccount, Refusal, RunAs, base_env

WRAPPER = Path(__file__).with_name("_wrapper.py")
KILLED = 128 + int(signal.SIGKILL)
VANISHED = -1
"""``poll``'s code for a process gone without an exit code (its node rebooted): the
agent reports the attempt ``lost`` and the server requeues the job."""


class JobRunner(Protocol):
    kind: str

    def start(self, spec: JobSpec, *, now: float) -> LocalJob: ...

    def poll(self, job: LocalJob, *, now: float) -> int | None:
        """The exit code once the job is over, else None."""
        ...

    def stop(self, job: LocalJob, *, now: float, grace_s: float) -> LocalJob:
        """One step of stopping; returns the job with what was done recorded."""
        ...

    def release(self, job: LocalJob) -> None:
        """The job is over and reported: free what the runner kept for it."""
        ...

    def recover(self, job: LocalJob) -> LocalJob:
        """A record read back after an agent restart, made whole where the agent died
        in the middle of starting it (``ProcessRunner`` records its intent first)."""
        ...


def _prepare(
    store: JobStore, spec: JobSpec, node: str, account: PosixAccount | None = None
) -> tuple[Path, dict[str, str]]:
    """The attempt's directories, so that only its owner reaches its files: the attempt
    dir is the agent's (0711: passable, not listable; state, log and exit code 0600
    inside), ``run/`` (the job's working dir) and the checkpoint dir belong to the
    account and are 0700. Without an account (an unprivileged agent) everything is the
    agent's own, 0700."""
    d = store.job_dir(spec.job_id, spec.attempt)
    d.mkdir(mode=0o711, parents=True, exist_ok=True)
    d.chmod(0o711)
    run = d / "run"
    ckpt = store.checkpoint_dir(spec.job_id)
    for own in (run, ckpt):
        own.mkdir(mode=0o700, parents=True, exist_ok=True)
        if account is not None:
            os.chown(own, account.uid, account.gid)
        own.chmod(0o700)
    hostfile = d / "hostfile"
    hostfile.write_text(hostfile_text(spec) or f"{spec.master_addr} slots={max(1, len(spec.gpus))}\n")
    hostfile.chmod(0o644)
    return d, {"checkpoint_dir": str(ckpt), "hostfile": str(hostfile)}


def refused(job: LocalJob, why: str) -> LocalJob:
    """A job that may not run here: over at once with ``REFUSED`` and the reason in its
    log (the server records it FAILED; its owner reads why in ``gpufleet logs``)."""
    with open(job.log_path, "a") as f:
        f.write(f"gpufleet: not started: {why}\n")
    return _replace(job, exit_code=REFUSED)


def _read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class SimulatedRunner:
    """Holds the job's GPUs for ``GPUFLEET_SIMULATE_S`` seconds and exits 0; nothing runs.
    Its utilisation (``LocalJob.util``) is what the agent feeds the simulated probe."""

    kind = "simulated"

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def start(self, spec: JobSpec, *, now: float) -> LocalJob:
        d = self.store.job_dir(spec.job_id, spec.attempt)
        d.mkdir(parents=True, exist_ok=True)
        try:
            util = float(spec.env.get("GPUFLEET_SIMULATE_UTIL", "0.9"))
        except ValueError:
            util = 0.9
        return LocalJob(
            job_id=spec.job_id,
            attempt=spec.attempt,
            kind=self.kind,
            gpus=spec.gpus,
            dir=str(d),
            started_at=now,
            simulate_s=spec.simulate_s or 0.0,
            util=min(1.0, max(0.0, util)),
        )

    def poll(self, job: LocalJob, *, now: float) -> int | None:
        if job.stop_requested_at is not None:
            return 128 + int(signal.SIGTERM)
        return 0 if now >= job.started_at + (job.simulate_s or 0.0) else None

    def stop(self, job: LocalJob, *, now: float, grace_s: float) -> LocalJob:
        return job if job.stop_requested_at is not None else _replace(job, stop_requested_at=now)

    def release(self, job: LocalJob) -> None:
        pass

    def recover(self, job: LocalJob) -> LocalJob:
        return job


def _replace(job: LocalJob, **changes: object) -> LocalJob:
    import dataclasses

    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


class ProcessRunner:
    """Runs the command under the wrapper as the job's owner (``users.RunAs``), in a new
    session (its own process group), its own cgroup where the node has cgroup v2
    (``cgroups.Cgroups``), its own working dir, stdout+stderr to ``output.log``, with
    exactly its GPUs visible and an environment built from scratch (``launch_env``).

    Liveness: the child we started is polled directly; a job re-adopted after an agent
    restart is alive while its pid exists with the recorded create time (a reused pid
    has another). Its exit code then comes from the wrapper's file.

    Exactly once per attempt: the attempt's record is written *before* the wrapper is
    started (without a pid), so an agent killed between the two finds it after its
    restart and never starts that attempt a second time; ``recover`` then finds the
    wrapper by its command line (it names the attempt's exit-code file). No wrapper and
    no exit code: the attempt is reported lost, and the server requeues the job as a
    new attempt (at most once, never twice)."""

    kind = "process"

    def __init__(
        self,
        store: JobStore,
        *,
        node: str,
        run_as: RunAs | None = None,
        cgroups: Cgroups | None = None,
        limits: Limits = Limits(),
    ) -> None:
        self.store = store
        self.node = node
        self.run_as = run_as or RunAs(node=node)
        self.cgroups = cgroups
        self.limits = limits
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, spec: JobSpec, *, now: float) -> LocalJob:
        acct = self.run_as.resolve(spec.user)
        switch = acct if isinstance(acct, PosixAccount) and self.run_as.privileged else None
        d, paths = _prepare(self.store, spec, self.node, switch)
        job = LocalJob(
            job_id=spec.job_id,
            attempt=spec.attempt,
            kind=self.kind,
            gpus=spec.gpus,
            dir=str(d),
            started_at=now,
        )
        _private(job.log_path)
        if isinstance(acct, Refusal):
            return refused(job, acct.reason)
        self.store.save(job)  # the intent, before anything runs (see the class docstring)
        env = launch_env(spec, node=self.node, base=base_env(acct), **paths)
        argv = [sys.executable, "-I", "-S", str(WRAPPER), str(d / "exit_code")]
        cgroup = self.cgroups.create(spec.job_id, spec.attempt, self.limits) if self.cgroups else None
        if cgroup is not None:
            argv += ["--cgroup", str(cgroup)]
        if switch is not None:
            argv += ["--uid", str(switch.uid), "--gid", str(switch.gid)]
            argv += ["--groups", ",".join(map(str, switch.groups))]
        argv += ["--", *spec.command]
        with open(job.log_path, "ab") as log:
            if self.run_as.note and not self.run_as.privileged:
                log.write(f"gpufleet: {self.run_as.note}\n".encode())
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=d / "run",
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                log.write(f"gpufleet: cannot start the job: {exc}\n".encode())
                return _replace(job, exit_code=127)
        self._children[proc.pid] = proc
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = None
        return _replace(job, pid=proc.pid, create_time=created, cgroup=str(cgroup) if cgroup else None)

    def recover(self, job: LocalJob) -> LocalJob:
        if job.pid is not None or job.exit_code is not None:
            return job
        mark = str(job.path / "exit_code")
        for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
            argv = p.info.get("cmdline") or []
            if str(WRAPPER) in argv and mark in argv:
                return _replace(job, pid=p.info["pid"], create_time=p.info["create_time"])
        return job  # never started, or already gone: ``poll`` reads its exit code or calls it lost

    def _alive(self, job: LocalJob) -> bool:
        if job.pid is None:
            return False
        child = self._children.get(job.pid)
        if child is not None:
            return child.poll() is None
        try:
            p = psutil.Process(job.pid)
            same = job.create_time is None or abs(p.create_time() - job.create_time) < 0.01
            return same and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def poll(self, job: LocalJob, *, now: float) -> int | None:
        if job.exit_code is not None:
            return job.exit_code
        if self._alive(job):
            return None
        code = _read_exit(job.path / "exit_code")
        if code is not None:
            return code
        child = self._children.get(job.pid or -1)
        if child is not None and child.returncode is not None:
            rc = child.returncode
            return 128 - rc if rc < 0 else rc
        return KILLED if job.killed else VANISHED  # gone without a word (e.g. the node rebooted)

    def stop(self, job: LocalJob, *, now: float, grace_s: float) -> LocalJob:
        if job.pid is None or not self._alive(job):
            return job
        if job.stop_requested_at is None:
            self._signal(job.pid, signal.SIGTERM)
            return _replace(job, stop_requested_at=now)
        if now - job.stop_requested_at >= grace_s:
            self._signal(job.pid, signal.SIGKILL)
            return _replace(job, killed=True)
        return job

    def _signal(self, pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def release(self, job: LocalJob) -> None:
        child = self._children.pop(job.pid or -1, None)
        if child is not None:
            child.poll()
        if self.cgroups is not None and job.cgroup:
            self.cgroups.remove(Path(job.cgroup))


def _private(path: Path) -> None:
    """Create ``path`` (if missing) readable by the agent only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
