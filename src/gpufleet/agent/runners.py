"""Job runners: how a job attempt is started, watched and stopped on this node.

``JobRunner`` is the seam; the agent picks one per job: ``ContainerRunner`` when the job
has an image (``container.py``), ``SimulatedRunner`` when it carries
``GPUFLEET_SIMULATE_S``, else ``ProcessRunner``. Runners never raise for a job that
cannot start: they return it already exited (127 and a line in its log) instead.

Stopping is a step function the agent calls every tick until the job is gone: the
first call sends SIGTERM, a call ``grace_s`` after it SIGKILL (cancel, preemption and
time limit all come as "no longer desired"). ``send_signal`` is sbatch's ``--signal``:
the agent calls it once per attempt, when the time left reaches the signal's seconds
(``Agent.tick``), for the job's whole process group or (``B:``) its batch shell only.
Every node of a multi-node job signals its own processes: the batch script runs on the
first node only (Slurm's batch host), the others hold the attempt with a placeholder
(``steps.HOLD``) for its steps' tasks (``ProcessRunner.start_task``, issue 31), which
end with it.

Slurm's batch options for a process job (``ProcessRunner``): the working directory is
``--chdir`` (relative: to the submit dir), else the directory it was submitted from
(``SLURM_SUBMIT_DIR``) where the job's account can enter it on this node, else the
attempt's private ``run/`` (with a line in the log saying why). ``--output``,
``--error`` and ``--input`` are expanded (``jobs.slurm_path``) and opened by the
wrapper as the job's account; ``output.log`` keeps everything regardless. Only the
first node of a multi-node job (rank 0, Slurm's batch host) has them: the others write
``output.log`` only and read nothing on stdin, as a Slurm batch script runs on the first
node alone and ``srun`` sends stdin to task 0 only. No file unless one is asked for:
Slurm's default ``slurm-%j.out`` is not written (the node may not see the submit dir at
all, every job's output is in ``gpufleet logs``, and a front end that wants Slurm's
default, ``gpufleet sbatch``, sends ``output="slurm-%j.out"`` itself, ``slurm-%A_%a.out``
for an array). Container jobs run in ``/work`` and take none of these files.
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

from gpufleet.agent.cgroups import Cgroups, Limits, kill_all, marked, members, signal_all
from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob, hostfile_text, launch_env, slurm_path
from gpufleet.agent.users import REFUSED, PosixAccount, Refusal, RunAs, base_env

WRAPPER = Path(__file__).with_name("_wrapper.py")
SHELL_PID = "shell_pid"
"""In the attempt dir: the pid of the job's command, written by the wrapper."""
KILLED = 128 + int(signal.SIGKILL)
VANISHED = -1
"""``poll``'s code for a process gone without an exit code (its node rebooted): the
agent reports the attempt ``lost`` and the server requeues the job."""


ROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
"""The whole environment of what the agent runs as root for a job (the wrapper): fixed,
nothing of the job's nor of the agent's own (see ``write_env``)."""


def write_env(path: Path, env: Mapping[str, str]) -> Path:
    """The job's environment for the wrapper (``--env-file``): ``KEY=VALUE`` entries
    separated by NUL bytes, a new 0600 file of the agent's. It is the only way the job's
    environment reaches the wrapper, which applies it only in the child that has
    dropped to the job's account, right before ``execve``: the root side (whose dynamic
    loader honours ``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``GCONV_PATH``, ...) never runs
    with it. Raises ValueError for what ``execve`` cannot carry (a NUL anywhere, "=" or
    nothing in a key), as ``subprocess`` did."""
    parts: list[bytes] = []
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"unusable environment variable {key[:64]!r}")
        parts.append(os.fsencode(key) + b"=" + os.fsencode(value))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as f:
        f.write(b"\0".join(parts))
    return path


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

    def send_signal(self, job: LocalJob, *, signum: int, batch_only: bool) -> str | None:
        """``--signal``: ``signum`` to every process of the job, or to its batch shell
        only; None once sent, else why not."""
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


def _read_int(path: Path) -> int | None:
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

    def send_signal(self, job: LocalJob, *, signum: int, batch_only: bool) -> str | None:
        return "a simulated job has no processes"


def _replace(job: LocalJob, **changes: object) -> LocalJob:
    import dataclasses

    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


class ProcessRunner:
    """Runs the command under the wrapper as the job's owner (``users.RunAs``), in a new
    session (its own process group), its own cgroup where the node has cgroups (v2 or v1,
    ``cgroups.Cgroups``: the limits, and every process it starts), its own working dir,
    stdout+stderr to ``output.log``, with
    exactly its GPUs visible and an environment built from scratch (``launch_env``),
    which only the job's own process gets (``write_env``; the root wrapper runs with
    ``ROOT_ENV``).

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
        self.wrapper = compiled_wrapper(store.root.parent)

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
        workdir = _workdir(spec)
        env = launch_env(
            spec,
            node=self.node,
            base=base_env(acct),
            submit_dir=spec.submit_dir or workdir or str(d / "run"),
            **paths,
        )
        argv = [sys.executable, "-I", "-S", str(self.wrapper), str(d / "exit_code")]
        try:
            argv += ["--env-file", str(write_env(d / "env", env))]
        except (OSError, ValueError) as exc:  # ValueError: a NUL or "=" where it cannot be
            with open(job.log_path, "ab") as log:
                log.write(f"gpufleet: cannot start the job: {exc}\n".encode())
            return _replace(job, exit_code=127)
        cgroup = (
            self.cgroups.create(spec.job_id, spec.attempt, self.limits, node=self.node)
            if self.cgroups
            else None
        )
        if cgroup is not None:
            argv += ["--cgroup", cgroup]
        if switch is not None:
            argv += ["--uid", str(switch.uid), "--gid", str(switch.gid)]
            argv += ["--groups", ",".join(map(str, switch.groups))]
        argv += ["--pid-file", str(d / SHELL_PID), *_slurm_args(spec, self.node, workdir)]
        argv += ["--", *spec.command]
        with open(job.log_path, "ab") as log:
            if self.run_as.note and not self.run_as.privileged:
                log.write(f"gpufleet: {self.run_as.note}\n".encode())
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=d / "run",
                    env=dict(ROOT_ENV),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument
                log.write(f"gpufleet: cannot start the job: {exc}\n".encode())
                return _replace(job, exit_code=127)
        self._children[proc.pid] = proc
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = None
        uid = switch.uid if switch is not None else None
        return _replace(job, pid=proc.pid, create_time=created, cgroup=cgroup, uid=uid)

    def start_task(
        self,
        spec: JobSpec,
        *,
        task_dir: Path,
        env: Mapping[str, str],
        command: tuple[str, ...],
        workdir: str | None,
        cgroup: str | None,
    ) -> tuple[subprocess.Popen[bytes] | None, str | None]:
        """A job step's task (``agent/steps.py``): ``command`` under the wrapper as the
        job's owner, with ``env`` (through the env file, as a job's), inside the job
        attempt's ``cgroup``, output to ``task_dir/output.log``. The child, or why not
        (a line in the log says so too)."""
        acct = self.run_as.resolve(spec.user)
        if isinstance(acct, Refusal):
            return None, acct.reason
        switch = acct if isinstance(acct, PosixAccount) and self.run_as.privileged else None
        log_path = task_dir / "output.log"
        _private(log_path)
        argv = [sys.executable, "-I", "-S", str(self.wrapper), str(task_dir / "exit_code")]
        try:
            argv += ["--env-file", str(write_env(task_dir / "env", env))]
        except (OSError, ValueError) as exc:
            return None, f"cannot start the task: {exc}"
        if cgroup:
            argv += ["--cgroup", cgroup]
        if switch is not None:
            argv += ["--uid", str(switch.uid), "--gid", str(switch.gid)]
            argv += ["--groups", ",".join(map(str, switch.groups))]
        if workdir:
            argv += ["--workdir", "./" + workdir if workdir.startswith("-") else workdir]
        argv += ["--", *command]
        run = self.store.job_dir(spec.job_id, spec.attempt) / "run"
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=run if run.is_dir() else task_dir,
                    env=dict(ROOT_ENV),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except (OSError, ValueError) as exc:
                return None, f"cannot start the task: {exc}"
        return proc, None

    def recover(self, job: LocalJob) -> LocalJob:
        if job.pid is not None or job.exit_code is not None:
            return job
        mark = str(job.path / "exit_code")
        wrappers = {str(WRAPPER), str(self.wrapper)}
        for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
            argv = p.info.get("cmdline") or []
            if mark in argv and wrappers & set(argv):
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
        """The exit code once the wrapper is over *and* nothing the job started is left:
        leftovers (a ``setsid`` daemon, a double fork) are killed here, and the attempt
        is over only at a later poll that finds none, so its GPUs are offered again only
        then."""
        if job.exit_code is not None:
            return job.exit_code
        if self._alive(job) or self._leftovers(job):
            return None
        code = _read_int(job.path / "exit_code")
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
            self._signal(job, signal.SIGTERM)
            return _replace(job, stop_requested_at=now)
        if now - job.stop_requested_at >= grace_s:
            self._signal(job, signal.SIGKILL)
            return _replace(job, killed=True)
        return job

    def _signal(self, job: LocalJob, sig: signal.Signals) -> None:
        """``sig`` to the job's process group and to every other process of it (its
        cgroup, else its marked processes): a detached one gets the same grace."""
        if job.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job.pid, sig)
        if sig == signal.SIGKILL and job.cgroup:
            kill_all(job.cgroup)
        elif job.cgroup:
            signal_all(job.cgroup, sig)
        else:
            for pid in marked(str(job.path / "hostfile")):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def _leftovers(self, job: LocalJob) -> bool:
        """The wrapper is gone: kill what the job left behind (SIGKILL, as Slurm ends a
        job's processes at its end); True while any was found."""
        if job.cgroup:
            return bool(members(job.cgroup)) and bool(kill_all(job.cgroup))
        found = marked(str(job.path / "hostfile"))
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return bool(found)

    def send_signal(self, job: LocalJob, *, signum: int, batch_only: bool) -> str | None:
        """To the process group (the wrapper leads it and survives such signals), or to
        the wrapper's child, whose pid the wrapper wrote to ``shell_pid``: only while
        the wrapper is the one recorded and that pid is still its child (never a reused
        pid). A line in the job's log says what was sent."""
        if job.pid is None or not self._alive(job):
            return "the job is not running"
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        try:
            if batch_only:
                shell = _read_int(job.path / SHELL_PID)
                if shell is None or psutil.Process(shell).ppid() != job.pid:
                    return "its batch shell is not running"
                os.kill(shell, signum)
            else:
                os.killpg(job.pid, signum)
        except (psutil.Error, OSError) as exc:
            return f"cannot signal it: {exc}"
        whom = "the batch shell" if batch_only else "every process of the job"
        with contextlib.suppress(OSError), open(job.log_path, "a") as f:
            f.write(f"gpufleet: sent {name} to {whom} (--signal)\n")
        return None

    def release(self, job: LocalJob) -> None:
        child = self._children.pop(job.pid or -1, None)
        if child is not None:
            child.poll()
        if self.cgroups is not None and job.cgroup:
            self.cgroups.remove(job.cgroup)


def compiled_wrapper(where: Path) -> Path:
    """The wrapper compiled into ``where`` (the agent's work dir: the jobs' accounts cannot
    change it), or its source where that fails: Python compiles a script it runs from
    source on every start (1.5 ms of each job's start), never bytecode it is given."""
    import py_compile

    target = where / "_wrapper.pyc"
    try:
        py_compile.compile(str(WRAPPER), cfile=str(target), doraise=True)
    except (OSError, py_compile.PyCompileError):
        return WRAPPER
    return target


def _workdir(spec: JobSpec) -> str | None:
    """The job's own working directory: ``--chdir`` (relative: to the submit dir), else
    its submit dir; None: the attempt's private ``run/``."""
    if spec.workdir:
        if os.path.isabs(spec.workdir) or not spec.submit_dir:
            return spec.workdir
        return os.path.join(spec.submit_dir, spec.workdir)
    return spec.submit_dir


def _slurm_args(spec: JobSpec, node: str, workdir: str | None) -> list[str]:
    """The wrapper's options for the working directory and the job's files (see the
    module's docstring). A value never reads as an option or as the wrapper's ``--``."""

    def arg(path: str) -> str:
        return "./" + path if path.startswith("-") else path

    args: list[str] = []
    if workdir:
        args += ["--workdir" if spec.workdir else "--submit-dir", arg(workdir)]
    if spec.node_rank == 0:
        for flag, pattern in (("--output", spec.output), ("--error", spec.error), ("--input", spec.input)):
            if pattern:
                args += [flag, arg(slurm_path(pattern, spec, node=node))]
    return args


def _private(path: Path) -> None:
    """Create ``path`` (if missing) readable by the agent only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
