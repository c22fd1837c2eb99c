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
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import psutil

from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob, hostfile_text, launch_env

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


def _prepare(store: JobStore, spec: JobSpec, node: str) -> tuple[Path, dict[str, str]]:
    d = store.job_dir(spec.job_id, spec.attempt)
    (d / "run").mkdir(parents=True, exist_ok=True)
    ckpt = store.checkpoint_dir(spec.job_id)
    ckpt.mkdir(parents=True, exist_ok=True)
    hostfile = d / "hostfile"
    hostfile.write_text(hostfile_text(spec) or f"{spec.master_addr} slots={max(1, len(spec.gpus))}\n")
    return d, {"checkpoint_dir": str(ckpt), "hostfile": str(hostfile)}


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


def _replace(job: LocalJob, **changes: object) -> LocalJob:
    import dataclasses

    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


class ProcessRunner:
    """Runs the command in a new session (its own process group) under the wrapper, in
    its own working dir, stdout+stderr to ``output.log``, with exactly its GPUs visible.

    Liveness: the child we started is polled directly; a job re-adopted after an agent
    restart is alive while its pid exists with the recorded create time (a reused pid
    has another). Its exit code then comes from the wrapper's file."""

    kind = "process"

    def __init__(self, store: JobStore, *, node: str, base_env: Mapping[str, str] | None = None) -> None:
        self.store = store
        self.node = node
        self.base_env = base_env
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, spec: JobSpec, *, now: float) -> LocalJob:
        d, paths = _prepare(self.store, spec, self.node)
        env = launch_env(spec, node=self.node, base=self.base_env, **paths)
        job = LocalJob(
            job_id=spec.job_id,
            attempt=spec.attempt,
            kind=self.kind,
            gpus=spec.gpus,
            dir=str(d),
            started_at=now,
        )
        argv = [sys.executable, "-I", "-S", str(WRAPPER), str(d / "exit_code"), "--", *spec.command]
        with open(job.log_path, "ab") as log:
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
        return _replace(job, pid=proc.pid, create_time=created)

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
