"""Job attempts on one node: what the server asks for (``JobSpec``), what the agent
holds (``LocalJob``, persisted in the work dir by ``JobStore``), and the environment a
job gets (``launch_env``, shared by the process and container runners).

Work-dir layout (``--work-dir``)::

    _wrapper.pyc                      the job wrapper, compiled (``runners.compiled_wrapper``)
    jobs/<job>-<attempt>/state.json   the LocalJob (pid + process create time, exit code...)
    jobs/<job>-<attempt>/output.log   stdout and stderr of the job (shipped to the server)
    jobs/<job>-<attempt>/exit_code    written by the wrapper when the job ends
    jobs/<job>-<attempt>/shell_pid    the pid of the job's command ("batch shell", --signal=B:)
    jobs/<job>-<attempt>/run/         the job's working directory, unless it has one of its
                                      own (--chdir, else its submit dir where that exists
                                      on the node: ``runners.ProcessRunner``)
    jobs/<job>-<attempt>/hostfile     one line per node of the placement
    checkpoints/<job>/                GPUFLEET_CHECKPOINT_DIR: the same for every attempt
                                      (under --checkpoint-root instead when given: a
                                      shared filesystem makes it the same on every node)

Simulated jobs (the demo's trace workload) carry ``GPUFLEET_SIMULATE_S=<seconds>`` in
their environment: the agent then runs nothing and holds the GPUs that long
(``GPUFLEET_SIMULATE_UTIL`` = utilisation 0..1 the simulated GPUs show, default 0.9).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.api.nodes import DesiredJob
from gpufleet.migindex import device_gpu
from gpufleet.slurm.hostlist import compress

SIMULATE_ENV = "GPUFLEET_SIMULATE_S"
SIMULATE_UTIL_ENV = "GPUFLEET_SIMULATE_UTIL"
SECRET_ENV = ("GPUFLEET_TOKEN", "GPUFLEET_ADMIN_TOKEN", "GPUFLEET_AGENT_TOKEN")


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    node: str
    address: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    job_id: int
    attempt: int
    name: str = ""
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    image: str | None = None
    gpus: tuple[int, ...] = ()
    user: str = ""
    peers: tuple[Peer, ...] = ()
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    world_size: int = 1
    pool: str = ""
    array: tuple[int, int, int, int, int] | None = None
    """A job array's task: (array job id, task id, task count, min, max)."""
    output: str | None = None
    """sbatch's ``--output`` (a filename pattern, ``slurm_path``); ``error``, ``input`` alike."""
    error: str | None = None
    input: str | None = None
    submit_dir: str | None = None
    workdir: str | None = None
    signal: str | None = None
    """``[B:]NAME@SECONDS`` (``slurmopts.parse_signal``): sent that long before ``deadline``."""
    deadline: float | None = None
    """When the job's time limit ends (None: no limit, or not known yet)."""
    cpus_per_task: int = 0
    ntasks_per_node: int = 0
    cpus_per_node: int = 0
    mem_per_node_mb: int = 0
    devices: tuple[str, ...] = ()
    """What ``CUDA_VISIBLE_DEVICES`` names when it is not the GPU indices: the ``MIG-...``
    UUIDs of the MIG slices ``gpus`` holds (``gpufleet.mig.slice_index``), resolved by the
    agent from its inventory when it starts the job; the GPU's index for a GPU share."""
    share: tuple[int, int] | None = None
    """A GPU share's limits, (percent of the GPU's compute, MiB of its memory): set by the
    agent from the units ``gpus`` holds (``migindex.share_of``) and the GPU's memory."""
    mps_pipe_dir: str = ""
    """The MPS control daemon's pipe directory a share's job talks to ("": CUDA's default)."""
    credential: str = ""
    """The job's own credential (``GPUFLEET_TOKEN``: its owner's while it runs, from the
    sync reply; issue 31), with ``server_url`` and ``ca_file`` the way back to the server
    for the Slurm commands a job calls."""
    server_url: str = ""
    ca_file: str = ""
    slurm_bin: str = ""
    """The directory of the Slurm launchers (``srun``, ``scontrol``, ...: ``slurmbin.py``),
    put first on the job's PATH ("": none, a container job)."""

    @classmethod
    def from_desired(cls, d: DesiredJob) -> JobSpec:
        return cls(
            job_id=d.job_id,
            attempt=d.attempt,
            name=d.name,
            command=tuple(d.command),
            env=dict(d.env),
            image=d.image,
            gpus=tuple(d.gpus),
            user=d.user,
            peers=tuple(Peer(node=p.node, address=p.address, gpus=tuple(p.gpus)) for p in d.nodes),
            node_rank=d.node_rank,
            master_addr=d.master_addr or "127.0.0.1",
            master_port=d.master_port or 29500,
            world_size=d.world_size or max(1, len(d.gpus)),
            pool=d.pool,
            array=None
            if d.array is None
            else (d.array.array_job_id, d.array.task_id, d.array.count, d.array.min, d.array.max),
            output=d.output or None,
            error=d.error or None,
            input=d.input or None,
            submit_dir=d.submit_dir or None,
            workdir=d.workdir or None,
            signal=d.signal or None,
            deadline=d.deadline,
            cpus_per_task=d.cpus_per_task,
            ntasks_per_node=d.ntasks_per_node,
            cpus_per_node=d.cpus_per_node,
            mem_per_node_mb=d.mem_per_node_mb,
            credential=d.credential or "",
        )

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def simulate_s(self) -> float | None:
        raw = self.env.get(SIMULATE_ENV)
        if raw is None:
            return None
        try:
            return max(0.0, float(raw))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalJob:
    """One job attempt this node holds, as persisted. ``exit_code`` is set once it is over;
    ``log_acked`` is how many bytes of its log the server confirmed."""

    job_id: int
    attempt: int
    kind: str
    gpus: tuple[int, ...]
    dir: str
    started_at: float
    pid: int | None = None
    create_time: float | None = None
    container: str | None = None
    cgroup: str | None = None
    simulate_s: float | None = None
    util: float = 0.0
    stop_requested_at: float | None = None
    killed: bool = False
    exit_code: int | None = None
    log_acked: int = 0
    port: int | None = None
    """A service replica: the node port it serves on (``$PORT``)."""
    health_path: str | None = None
    """A service replica: the path probed for readiness."""
    signal: str | None = None
    """``--signal``'s ``[B:]NAME@SECONDS``, and ``deadline``, the end of its time limit
    (both kept up to date from the desired job: the server knows the deadline only once
    the job runs)."""
    deadline: float | None = None
    signal_sent_at: float | None = None
    """When ``signal`` was sent (recorded before it is sent: never twice per attempt)."""
    uid: int | None = None
    """The account it runs as (a root agent's process job): what of it NVML still lists on
    its GPUs after its end is killed (``gpusweep.GpuSweeps``)."""
    exit_reported: bool = False
    """Its exit went out in a sync the server answered (reported at once, before the
    rest of its log: ``logship``)."""
    ended_at: float | None = None
    """When the agent saw it over (its log is shipped for a while after, not for ever)."""
    log_capped: bool = False
    """The server has the cap's marker line: what follows is skipped without one."""
    log_done: bool = False
    """The server has the chunk that closes its log (``last``): nothing more to ship."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def log_path(self) -> Path:
        return Path(self.dir) / "output.log"

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0


def launch_env(
    spec: JobSpec,
    *,
    node: str,
    checkpoint_dir: str,
    hostfile: str,
    base: Mapping[str, str],
    submit_dir: str | None = None,
) -> dict[str, str]:
    """The job's environment, built from scratch: ``base`` (``users.base_env`` for a
    process: a minimal PATH and the account's identity; nothing for a container, whose
    image brings its own), the job's ``env``, then what gpufleet sets, which the job
    cannot override. Nothing of the agent's own environment reaches a job.
    ``submit_dir``: ``SLURM_SUBMIT_DIR`` (default: the job's submit dir, else its
    ``--chdir``)."""
    env = dict(base)
    env.update({k: v for k, v in spec.env.items() if k not in SECRET_ENV})
    visible = ",".join(spec.devices) if spec.devices else ",".join(map(str, spec.gpus))
    local = len(spec.devices) if spec.devices else len(spec.gpus)
    peers = spec.peers or (Peer(node=node, address=spec.master_addr, gpus=spec.gpus),)
    env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's indices = NVML's (the ones assigned)
            "CUDA_VISIBLE_DEVICES": visible,
            "NVIDIA_VISIBLE_DEVICES": visible or "void",
            "GPUFLEET_JOB_ID": str(spec.job_id),
            "GPUFLEET_JOB_NAME": spec.name,
            "GPUFLEET_ATTEMPT": str(spec.attempt),
            "GPUFLEET_NODE": node,
            "GPUFLEET_CHECKPOINT_DIR": checkpoint_dir,
            "GPUFLEET_HOSTFILE": hostfile,
            "GPUFLEET_NODES": ",".join(p.address for p in peers),
            "GPUFLEET_NNODES": str(len(peers)),
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(spec.master_port),
            "WORLD_SIZE": str(spec.world_size),
            "NODE_RANK": str(spec.node_rank),
            "LOCAL_WORLD_SIZE": str(max(1, local)),
        }
    )
    env.update(share_env(spec))
    env.update(slurm_env(spec, node=node, peers=peers, submit_dir=submit_dir))
    env.update(server_env(spec, path=env.get("PATH", "")))
    return env


def server_env(spec: JobSpec, *, path: str) -> dict[str, str]:
    """The way back to the server, set after the job's own environment so it is never
    shadowed (issue 31): ``GPUFLEET_URL``, ``GPUFLEET_TOKEN`` (the job's own credential,
    never the node's), ``GPUFLEET_CA_FILE`` where the node trusts a private CA, and
    ``PATH`` (``path``: the job's) starting with the Slurm launchers (``srun``,
    ``scontrol``, ...)."""
    out: dict[str, str] = {}
    if spec.credential and spec.server_url:
        out["GPUFLEET_URL"] = spec.server_url
        out["GPUFLEET_TOKEN"] = spec.credential
        if spec.ca_file:
            out["GPUFLEET_CA_FILE"] = spec.ca_file
    if spec.slurm_bin:
        rest = [p for p in path.split(os.pathsep) if p and p != spec.slurm_bin]
        out["PATH"] = os.pathsep.join([spec.slurm_bin, *rest]) if rest else spec.slurm_bin
    return out


MPS_PIPE_DIR = "/tmp/nvidia-mps"
"""CUDA's default pipe directory of the MPS control daemon."""


def share_env(spec: JobSpec) -> dict[str, str]:
    """A GPU share's limits, enforced by NVIDIA MPS (``nvidia-cuda-mps-control(1)``,
    "Client limits"): ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the share of the GPU's
    multiprocessors its kernels get, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` the device memory
    it may allocate ("0=10240M": device 0 of those it sees). Where no MPS control daemon
    runs, CUDA ignores them and the job shares the GPU by time-slicing: the scheduler still
    admits shares by memory, but nothing stops a job from taking more (the agent warns at
    start, ``mps_running``). Empty for a job on whole GPUs or MIG slices."""
    if spec.share is None:
        return {}
    percent, memory_mb = spec.share
    out = {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mb}M",
        "GPUFLEET_GPU_FRACTION": f"{percent / 100:g}",
        "GPUFLEET_GPU_MEMORY_MB": str(memory_mb),
    }
    # always named: a job's own CUDA_MPS_PIPE_DIRECTORY pointing nowhere would run it unlimited
    out["CUDA_MPS_PIPE_DIRECTORY"] = spec.mps_pipe_dir or MPS_PIPE_DIR
    return out


def mps_running(pipe_dir: str = "") -> bool:
    """Whether an MPS control daemon listens in ``pipe_dir`` (default: CUDA's
    ``/tmp/nvidia-mps``): its ``control`` socket is there."""
    try:
        return stat.S_ISSOCK(os.stat(os.path.join(pipe_dir or MPS_PIPE_DIR, "control")).st_mode)
    except OSError:
        return False


def slurm_env(
    spec: JobSpec, *, node: str, peers: tuple[Peer, ...], submit_dir: str | None = None
) -> dict[str, str]:
    """The Slurm variables a batch script reads (``sbatch(1)``, OUTPUT ENVIRONMENT
    VARIABLES), so scripts written for Slurm run unchanged. One task per node unless
    the job says otherwise (``--ntasks-per-node``); ``SLURM_JOB_NODELIST`` is Slurm's
    compressed hostlist (``node-[001-003]``), in placement order (the batch host
    first), so ``scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`` is the batch
    host. The CPU and memory variables only where the job has those numbers;
    ``SLURM_JOB_CPUS_PER_NODE`` in Slurm's form (``16`` on one node, ``16(x2)`` on two)."""
    nnodes = len(peers)
    tasks = spec.ntasks_per_node or 1
    out = {
        "SLURM_JOB_ID": str(spec.job_id),
        "SLURM_JOBID": str(spec.job_id),
        "SLURM_JOB_NAME": spec.name,
        "SLURM_JOB_USER": spec.user,
        "SLURM_JOB_PARTITION": spec.pool,
        "SLURM_JOB_NODELIST": compress([p.node for p in peers]),
        "SLURM_NODELIST": compress([p.node for p in peers]),
        "SLURM_NNODES": str(len(peers)),
        "SLURM_JOB_NUM_NODES": str(len(peers)),
        "SLURM_NODEID": str(spec.node_rank),
        "SLURMD_NODENAME": node,
        "SLURM_NTASKS": str(tasks * nnodes),
        "SLURM_NPROCS": str(tasks * nnodes),
        "SLURM_PROCID": "0",  # the batch script is task 0 of its first node (``srun`` sets each task's)
        "SLURM_LOCALID": "0",
        "SLURM_GPUS_ON_NODE": str(len(spec.devices) if spec.devices else len(spec.gpus)),
        "SLURM_JOB_GPUS": ",".join(map(str, sorted({device_gpu(g) for g in spec.gpus}))),
    }
    where = submit_dir or spec.submit_dir or spec.workdir
    if where:
        out["SLURM_SUBMIT_DIR"] = where
    if spec.cpus_per_task > 0:
        out["SLURM_CPUS_PER_TASK"] = str(spec.cpus_per_task)
    if spec.gpus:
        out["SLURM_GPUS_PER_NODE"] = out["SLURM_GPUS_ON_NODE"]
    if spec.ntasks_per_node > 0:
        out["SLURM_NTASKS_PER_NODE"] = str(spec.ntasks_per_node)
        out["SLURM_TASKS_PER_NODE"] = _per_node(spec.ntasks_per_node, nnodes)
    if spec.mem_per_node_mb > 0:
        out["SLURM_MEM_PER_NODE"] = str(spec.mem_per_node_mb)
    if spec.cpus_per_node > 0:
        out["SLURM_CPUS_ON_NODE"] = str(spec.cpus_per_node)
        out["SLURM_JOB_CPUS_PER_NODE"] = _per_node(spec.cpus_per_node, nnodes)
    if spec.array is not None:
        array_id, task, count, lo, hi = spec.array
        out |= {
            "SLURM_ARRAY_JOB_ID": str(array_id),
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_TASK_MIN": str(lo),
            "SLURM_ARRAY_TASK_MAX": str(hi),
        }
    return out


def _per_node(count: int, nnodes: int) -> str:
    """Slurm's per-node list for equal nodes: ``4`` on one node, ``4(x3)`` on three."""
    return str(count) if nnodes <= 1 else f"{count}(x{nnodes})"


NO_ARRAY_TASK = 4294967294
"""``%a`` of a job that is no array task: Slurm's NO_VAL, which it prints as is."""
_PATTERN = re.compile(r"%(%|(\d*)([A-Za-z]))")


def slurm_path(pattern: str, spec: JobSpec, *, node: str) -> str:
    """sbatch's filename pattern (``--output``, ``--error``, ``--input``) expanded as
    Slurm expands it for a batch job: ``%j`` job id, ``%J`` ``<job id>.batch``, ``%A``
    array job id (the job id outside an array, as Slurm), ``%a`` array task id
    (4294967294 outside an array: Slurm's NO_VAL, printed as is), ``%b`` the task id
    modulo 10, ``%x`` job name, ``%u`` its user (as ``SLURM_JOB_USER``: the gpufleet
    name, not the POSIX account it maps to), ``%N`` the short name of the job's first
    node (the batch host), ``%n`` the node's rank, ``%s`` ``batch``, ``%t`` 0, ``%%`` a
    ``%``. A number between ``%`` and the letter zero-pads a number (``%4a``; at most
    10). Any other letter stays as written; a backslash anywhere turns expansion off
    (and is removed, ``\\\\`` leaving one). The result is relative to the job's working
    directory unless absolute."""
    if "\\" in pattern:
        return re.sub(r"\\(.?)", r"\1", pattern)
    if spec.array is not None:
        array_job, task = spec.array[0], spec.array[1]
    else:
        array_job, task = spec.job_id, NO_ARRAY_TASK
    first = spec.peers[0].node if spec.peers else node
    numbers = {"j": spec.job_id, "A": array_job, "a": task, "b": task % 10, "n": spec.node_rank, "t": 0}
    words = {"x": spec.name, "u": spec.user, "N": first.split(".")[0], "s": "batch"}

    def one(m: re.Match[str]) -> str:
        if m[1] == "%":
            return "%"
        width, key = min(int(m[2] or 0), 10), m[3]
        if key in numbers:
            return str(numbers[key]).zfill(width)
        if key == "J":
            return f"{str(spec.job_id).zfill(width)}.batch"
        return words.get(key, m[0])

    return _PATTERN.sub(one, pattern)


def hostfile_text(spec: JobSpec) -> str:
    """DeepSpeed/MPI style: ``address slots=N`` per node, master first."""
    return "".join(f"{p.address} slots={max(1, len(p.gpus))}\n" for p in spec.peers)


class JobStore:
    """LocalJob records under ``<work_dir>/jobs``; each write is atomic (tmp + rename).

    Permissions: the work dir, ``jobs/`` and ``checkpoints/`` are 0711 (a job passes
    through to its own directories, lists nothing), every record 0600; what a job may
    touch is made its owner's by the runner (``runners._prepare``)."""

    def __init__(self, work_dir: Path, *, checkpoints: Path | None = None) -> None:
        work_dir = work_dir.absolute()  # the wrapper is given paths in it, and changes its directory
        self.root = work_dir / "jobs"
        self.checkpoints = (checkpoints or work_dir).absolute() / "checkpoints"
        for d in (work_dir, self.root, self.checkpoints):
            d.mkdir(mode=0o711, parents=True, exist_ok=True)
            d.chmod(0o711)

    def job_dir(self, job_id: int, attempt: int) -> Path:
        return self.root / f"{job_id}-{attempt}"

    def checkpoint_dir(self, job_id: int) -> Path:
        return self.checkpoints / str(job_id)

    def save(self, job: LocalJob) -> None:
        path = job.path / "state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(dataclasses.asdict(job)))
        os.replace(tmp, path)

    def load_all(self) -> list[LocalJob]:
        out = []
        for path in sorted(self.root.glob("*/state.json")):
            try:
                raw: dict[str, Any] = json.loads(path.read_text())
                raw["gpus"] = tuple(raw.get("gpus", ()))
                out.append(LocalJob(**raw))
            except (OSError, ValueError, TypeError):
                continue  # a torn or foreign file: not ours to run
        return out

    def forget(self, job: LocalJob) -> None:
        shutil.rmtree(job.path, ignore_errors=True)
