"""Job step tasks on this node (``srun`` inside an allocation, issue 31).

The server lists the tasks of running steps a node should run with each desired job
(``DesiredJob.steps``); ``StepTasks`` starts the missing ones, stops the ones no longer
listed (a cancelled step, ``--kill-on-bad-exit``, the job's end), and reports each with
its output (``StepTaskIn``) until the server has its exit (``StepAck.done``).

A task runs only inside its job's attempt on this node, which must be held and running
here: as the job's owner, through the job wrapper, in the attempt's cgroup and with the
attempt's environment (``jobs.launch_env``: its GPUs, its mark ``GPUFLEET_HOSTFILE``),
so whatever ends the job's processes ends its tasks too (a cancel, a time limit, the
batch script's end: ``runners.ProcessRunner`` kills the cgroup, or the marked processes
without one). Over that: the step's environment (srun's ``--export``), then the task's
Slurm variables (``task_env``). Only process jobs: a container or simulated job has no
tasks here (their steps wait, and end with the job).

Records are in memory, each task's files under ``<work_dir>/steps/<job>-<attempt>/<step>.<procid>/``:
an agent restarted while a task ran finds its directory, never starts it twice, and
reports it lost (exit -1) with what output its file holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.jobs import JobSpec, LocalJob, launch_env
from gpufleet.agent.runners import ProcessRunner
from gpufleet.agent.users import PosixAccount, base_env
from gpufleet.api.steps import DesiredStep, StepAck
from gpufleet.slurm.hostlist import compress

TaskKey = tuple[int, int, int, int]
"""(job, attempt, step, procid)."""
CHUNK_BYTES = 64 * 1024
"""At most this much of one task's output per sync."""
LOST = -1
JOB_WIDE = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
"""Variables gpufleet sets for a job that are the same on every node: a task takes them
from the step's environment, where a script's ``export MASTER_ADDR=...`` (the launcher
pattern of real multi-node scripts) has replaced them. Per-node ones (``NODE_RANK``,
``CUDA_VISIBLE_DEVICES``, ``SLURM_NODEID``...) stay the node's."""


@dataclass(slots=True, kw_only=True)
class StepTask:
    job_id: int
    attempt: int
    step: int
    procid: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    stop_at: float | None = None
    killed: bool = False
    shipped: int = 0

    @property
    def key(self) -> TaskKey:
        return (self.job_id, self.attempt, self.step, self.procid)

    @property
    def log(self) -> Path:
        return self.dir / "output.log"


def task_env(
    base: Mapping[str, str], d: DesiredStep, *, procid: int, localid: int, visible: list[str]
) -> dict[str, str]:
    """A task's Slurm variables over ``base`` (the job's environment on this node with
    the step's own): ``srun(1)``'s OUTPUT ENVIRONMENT VARIABLES, and its GPUs with
    ``--gpus-per-task`` (the LOCALID-th group of the node's GPUs)."""
    env = dict(base)
    per_node = ",".join(map(str, d.tasks_per_node))
    env |= {
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(d.node_index),
        "SLURM_STEP_ID": str(d.step),
        "SLURM_STEPID": str(d.step),
        "SLURM_NTASKS": str(d.ntasks),
        "SLURM_NPROCS": str(d.ntasks),
        "SLURM_STEP_NUM_TASKS": str(d.ntasks),
        "SLURM_STEP_NUM_NODES": str(len(d.nodes)),
        "SLURM_STEP_NODELIST": compress(list(d.nodes)),
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_NNODES": str(len(d.nodes)),
        "SLURM_NODELIST": compress(list(d.nodes)),
    }
    if d.cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(d.cpus_per_task)
    g = d.gpus_per_task
    if g and len(visible) >= (localid + 1) * g:
        mine = ",".join(visible[localid * g : (localid + 1) * g])
        env["CUDA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"] = mine
        env["SLURM_GPUS_ON_NODE"] = str(g)
    return env


class StepTasks:
    """The step tasks this node holds (see the module docstring). Not thread-safe: the
    agent calls it under its lock."""

    def __init__(
        self, *, work_dir: Path, node: str, runner: ProcessRunner, watch: Callable[[int], None]
    ) -> None:
        self.root = work_dir.absolute() / "steps"
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.node = node
        self.runner = runner
        self.watch = watch
        self.tasks: dict[TaskKey, StepTask] = {}

    def task_dir(self, key: TaskKey) -> Path:
        job, attempt, step, procid = key
        return self.root / f"{job}-{attempt}" / f"{step}.{procid}"

    # -- desired -> held ---------------------------------------------------------------------
    def apply(
        self,
        wanted: Iterable[tuple[JobSpec, DesiredStep]],
        jobs: Mapping[tuple[int, int], LocalJob],
        *,
        now: float,
        grace_s: float,
    ) -> bool:
        """Start the wanted tasks not held (inside their job's running attempt), stop
        the held ones no longer wanted; True if anything started or was told to stop."""
        news = False
        want: set[TaskKey] = set()
        for spec, d in wanted:
            job = jobs.get(spec.key)
            for procid in d.procids:
                key = (spec.job_id, spec.attempt, d.step, procid)
                want.add(key)
                if key in self.tasks or job is None or job.exit_code is not None or job.kind != "process":
                    continue
                self.tasks[key] = self._start(spec, d, job, key, _local(d, procid))
                news = True
        for key, task in self.tasks.items():
            if key not in want and task.exit_code is None and task.stop_at is None:
                self._signal(task, signal.SIGTERM)
                task.stop_at, task.killed = now, True
                news = True
        return news

    def _start(self, spec: JobSpec, d: DesiredStep, job: LocalJob, key: TaskKey, localid: int) -> StepTask:
        where = self.task_dir(key)
        task = StepTask(job_id=key[0], attempt=key[1], step=key[2], procid=key[3], dir=where)
        if where.exists():  # an earlier life of this agent started it: never twice
            task.exit_code = LOST
            return task
        where.mkdir(mode=0o711, parents=True)
        acct = self.runner.run_as.resolve(spec.user)
        env = launch_env(
            dataclasses.replace(spec, env={**spec.env, **d.env}),
            node=self.node,
            checkpoint_dir=str(self.runner.store.checkpoint_dir(spec.job_id)),
            hostfile=str(job.path / "hostfile"),  # the attempt's mark: its end ends this task
            base=base_env(acct if isinstance(acct, PosixAccount) else None),
            submit_dir=spec.submit_dir or spec.workdir,
        )
        env |= {k: d.env[k] for k in JOB_WIDE if k in d.env}  # srun's (the script's export) win
        visible = env.get("CUDA_VISIBLE_DEVICES", "")
        env = task_env(env, d, procid=key[3], localid=localid, visible=[v for v in visible.split(",") if v])
        proc, why = self.runner.start_task(
            spec, task_dir=where, env=env, command=tuple(d.command), workdir=d.workdir, cgroup=job.cgroup
        )
        if proc is None:
            with contextlib.suppress(OSError), open(task.log, "a") as f:
                f.write(f"gpufleet: task {key[3]} of step {key[0]}.{key[2]} not started: {why}\n")
            task.exit_code = 127
            return task
        task.proc = proc
        self.watch(proc.pid)
        return task

    # -- watching ----------------------------------------------------------------------------
    def poll(self, *, now: float, grace_s: float) -> bool:
        """Collect exits, step the stops; True if a task ended."""
        ended = False
        for task in self.tasks.values():
            if task.exit_code is not None or task.proc is None:
                continue
            if task.stop_at is not None and now - task.stop_at >= grace_s:
                self._signal(task, signal.SIGKILL)
            rc = task.proc.poll()
            if rc is None:
                continue
            code = _read_int(task.dir / "exit_code")
            task.exit_code = code if code is not None else (128 - rc if rc < 0 else rc)
            ended = True
        return ended

    def _signal(self, task: StepTask, sig: signal.Signals) -> None:
        if task.proc is not None and task.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(task.proc.pid, sig)

    def pending(self) -> bool:
        """An exit the server does not have yet, or whole lines of output (a partial line
        waits for its end, or for a chunk's worth)."""
        for t in self.tasks.values():
            if t.exit_code is not None:
                return True
            size = _size(t.log)
            if size - t.shipped >= CHUNK_BYTES:
                return True
            if size > t.shipped:
                with contextlib.suppress(OSError), open(t.log, "rb") as f:
                    f.seek(t.shipped)
                    if b"\n" in f.read(size - t.shipped):
                        return True
        return False

    # -- the sync ----------------------------------------------------------------------------
    def report(self) -> list[dict[str, Any]]:
        """Each task's state and the next piece of its output (whole lines while it
        runs); its exit only with the piece that reaches the end of its output."""
        out: list[dict[str, Any]] = []
        for task in self.tasks.values():
            size = _size(task.log)
            data = b""
            if size > task.shipped:
                with contextlib.suppress(OSError), open(task.log, "rb") as f:
                    f.seek(task.shipped)
                    data = f.read(min(CHUNK_BYTES, size - task.shipped))
            over = task.exit_code is not None
            if not over and len(data) < CHUNK_BYTES and b"\n" in data:
                data = data[: data.rindex(b"\n") + 1]  # whole lines: srun labels them
            elif not over and len(data) < CHUNK_BYTES:
                data = b""
            end = task.shipped + len(data)
            item: dict[str, Any] = {
                "job_id": task.job_id,
                "step": task.step,
                "procid": task.procid,
                "state": "exited" if over and end >= size else "running",
                "offset": task.shipped,
                "end": end,
                "data": data.decode("utf-8", errors="replace"),
            }
            if item["state"] == "exited":
                item["exit_code"] = task.exit_code
                item["killed"] = task.killed
            if data or item["state"] == "exited":
                out.append(item)
        return out

    def acked(self, acks: Iterable[StepAck], *, sent: Iterable[Mapping[str, Any]] = ()) -> None:
        """How far the server has each task: a task whose exit it has is forgotten. One
        reported (``sent``) and not acknowledged is not the node's to speak for (its step
        is gone): its output is dropped, and it is forgotten once over, so it never
        keeps the node syncing."""
        by_task = {(a.job_id, a.step, a.procid): a for a in acks}
        refused = {(i["job_id"], i["step"], i["procid"]) for i in sent} - set(by_task)
        for key, task in list(self.tasks.items()):
            ack = by_task.get((task.job_id, task.step, task.procid))
            if ack is None:
                if (task.job_id, task.step, task.procid) in refused:
                    task.shipped = _size(task.log)
                    if task.exit_code is not None:
                        del self.tasks[key]
                        shutil.rmtree(task.dir, ignore_errors=True)
                continue
            task.shipped = max(task.shipped, ack.end)
            if ack.done and task.exit_code is not None:
                del self.tasks[key]
                shutil.rmtree(task.dir, ignore_errors=True)

    def stop_all(self) -> None:
        for task in self.tasks.values():
            self._signal(task, signal.SIGKILL)


def _local(d: DesiredStep, procid: int) -> int:
    """SLURM_LOCALID: the task's place among this node's tasks of the step."""
    first = sum(d.tasks_per_node[: d.node_index])
    return procid - first


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


EVERY_NODE_ENV = "GPUFLEET_EVERY_NODE"
"""In a job's environment, ``1``: its command runs on every node of the job, as
``srun`` outside an allocation runs it (``gpufleet run -N 2 -- CMD`` sets it); without
it a multi-node job's command is a batch script, run on the first node only."""
HOLD = ("sleep", "infinity")
"""What a multi-node job's other nodes run instead of its batch script: nothing but a
process that holds the attempt (its cgroup, GPUs and mark) for its steps' tasks until
the job ends (Slurm runs the batch script on the first node only)."""


def prepare_job(
    spec: JobSpec, *, kind: str, service: bool, server_url: str, ca_file: str, slurm_bin: str, sleep: str
) -> JobSpec:
    """A job attempt as this node starts it (issue 31): the way back to the server and
    the Slurm launchers for a process job; on a node other than the first of a
    multi-node batch job, ``HOLD`` (``sleep``: its absolute path) instead of the script
    (unless the job asks for its command on every node, ``EVERY_NODE_ENV``)."""
    if kind != "process":
        return spec
    spec = dataclasses.replace(spec, server_url=server_url, ca_file=ca_file, slurm_bin=slurm_bin)
    if spec.node_rank > 0 and not service and spec.env.get(EVERY_NODE_ENV) != "1":
        spec = dataclasses.replace(spec, command=(sleep, *HOLD[1:]))
    return spec
