"""Container jobs (``--image``) through the Docker Engine API (``docker`` SDK).

The container's shape is a pure function, ``container_spec``, so what matters for
safety is tested as data. The operator's node policy is a ``ContainerPolicy``; whatever
it says, a container is never privileged, runs with ``no-new-privileges``, drops every
capability (``allowed_caps`` adds back only what the operator allows), sees only its
assigned ``/dev/nvidiaN`` plus the control devices that exist, and has a pids limit
(memory and CPU limits and a read-only root filesystem, with a tmpfs ``/tmp``, when
configured).

Who it runs as: the job owner's POSIX account ``uid:gid`` (``users.RunAs``), with the
account's supplementary groups, so the files it writes in ``/work`` (the job dir's
``run/``) and ``/checkpoint`` are the owner's; "nobody" (65534:65534) when there is no
account. ``GPUFLEET_CONTAINER_USER=uid:gid`` in the job's env overrides that only on a
node whose policy sets ``allow_user``, and only as numeric, non-zero ids: a name is
looked up in the image's ``/etc/passwd``, which the job's author controls, and a bare
uid gets gid 0 when the image has no entry for it. Anything else is a ``Refusal``: the
job exits 126 with the reason in its log, as the process runner does. (``/work`` stays
the owner's, 0700: an overriding uid other than the owner's cannot write there.)

Networking: a single-node job gets the default bridge. Processes of a multi-node job
find each other at the addresses the server hands out (``MASTER_ADDR``,
``GPUFLEET_NODES``: the nodes' own), and NCCL then opens connections on ports it picks
itself, which only a network that makes the containers reachable at those addresses
carries: the operator's network (``policy.network``, e.g. macvlan/ipvlan on the fabric,
routed accordingly), or the host's own (``policy.host_network``, an explicit opt-in:
the job then shares the node's network namespace). Without either, a multi-node job
gets a bridge network of its own (named after node/job/attempt and labelled
``gpufleet.*``; the runner creates it before the container and removes it in
``release``) and rank 0 publishes ``MASTER_PORT``, so rendezvous works, but NCCL
traffic that is not on that port does not reach the peers. Each such network takes a
subnet from the engine's ``default-address-pools``.

Slurm's batch options: a container runs in ``/work`` (``SLURM_SUBMIT_DIR=/work``: the
host's submit dir is not mounted), and ``--output``/``--error``/``--input``/``--chdir``
do not apply (its output is in ``gpufleet logs``). ``--signal`` goes through the
engine (``docker kill --signal``) to the container's main process, with or without
``B:``: the engine signals nothing else, so a shell entrypoint must pass it on to the
processes it started (``exec`` the program, or trap and forward).

``ContainerRunner`` drives it; the SDK is imported on first use, and a node without a
Docker engine fails such jobs with a clear line in their log (exit 125, as docker run).
The runner never raises for one job: failures become an exited job with the reason in
its log. ``FakeDocker`` (``fakedocker.py``) is the in-package double of the client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob, launch_env
from gpufleet.agent.runners import _prepare, _private
from gpufleet.agent.users import REFUSED, PosixAccount, Refusal, RunAs

log = logging.getLogger("gpufleet.agent")

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
NOBODY = "65534:65534"
USER_ENV = "GPUFLEET_CONTAINER_USER"
ENGINE_MISSING = 125
TMPFS_OPTIONS = "rw,nosuid,nodev"
_IDS = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerPolicy:
    """The operator's rules for containers on this node (agent flags)."""

    allowed_caps: tuple[str, ...] = ()
    runtime: str | None = None
    allow_user: bool = False
    pids_max: int = 4096
    memory_max_bytes: int | None = None
    cpus: float | None = None
    read_only_rootfs: bool = False
    network: str | None = None
    host_network: bool = False

    def __post_init__(self) -> None:
        if self.pids_max < 1:
            raise ValueError(f"pids_max must be at least 1, not {self.pids_max}")
        if self.memory_max_bytes is not None and self.memory_max_bytes <= 0:
            raise ValueError(f"memory_max_bytes must be positive, not {self.memory_max_bytes}")
        if self.cpus is not None and not self.cpus > 0:
            raise ValueError(f"cpus must be positive, not {self.cpus}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkSpec:
    """A bridge network the runner creates for one multi-node job attempt."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def docker_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``docker.client.networks.create``."""
        return {"name": self.name, "driver": "bridge", "labels": dict(self.labels)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSpec:
    name: str
    image: str
    command: tuple[str, ...]
    environment: Mapping[str, str]
    devices: tuple[str, ...]
    user: str = NOBODY
    group_add: tuple[str, ...] = ()
    privileged: bool = False
    cap_drop: tuple[str, ...] = ("ALL",)
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ("no-new-privileges",)
    pids_limit: int = 4096
    mem_limit: int | None = None
    nano_cpus: int | None = None
    read_only: bool = False
    tmpfs: Mapping[str, str] = field(default_factory=dict)
    working_dir: str = "/work"
    volumes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    network_mode: str | None = None
    network: str | None = None
    job_network: NetworkSpec | None = None
    ports: Mapping[str, int] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    runtime: str | None = None

    def docker_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``docker.client.containers.run`` (detached)."""
        kw: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command) or None,
            "name": self.name,
            "environment": dict(self.environment),
            "devices": list(self.devices),
            "user": self.user,
            "privileged": self.privileged,
            "cap_drop": list(self.cap_drop),
            "security_opt": list(self.security_opt),
            "pids_limit": self.pids_limit,
            "read_only": self.read_only,
            "working_dir": self.working_dir,
            "volumes": {k: dict(v) for k, v in self.volumes.items()},
            "labels": dict(self.labels),
            "detach": True,
        }
        optional: dict[str, Any] = {
            "group_add": list(self.group_add),
            "cap_add": list(self.cap_add),
            "mem_limit": self.mem_limit,
            "memswap_limit": self.mem_limit,  # the same: no swap on top of the limit
            "nano_cpus": self.nano_cpus,
            "tmpfs": dict(self.tmpfs),
            "network_mode": self.network_mode,
            "network": self.network,
            "ports": dict(self.ports),
            "runtime": self.runtime,
        }
        kw.update({k: v for k, v in optional.items() if v})
        return kw


def container_name(node: str, spec: JobSpec) -> str:
    """The container's name, also its per-job network's: one per node and attempt."""
    return f"gpufleet-{node}-{spec.job_id}-{spec.attempt}"


def container_user(
    spec: JobSpec, *, account: PosixAccount | None, policy: ContainerPolicy
) -> tuple[str, tuple[str, ...]] | Refusal:
    """Pure: ``(user, group_add)`` for the container, or why the job may not run."""
    override = spec.env.get(USER_ENV, "").strip()
    if override:
        if not policy.allow_user:
            return Refusal(reason=f"{USER_ENV} is not allowed on this node: jobs run as their owner")
        parts = override.split(":")
        if any(p == "root" or (p.isascii() and p.isdigit() and int(p) == 0) for p in parts):
            return Refusal(reason=f"{USER_ENV}={override!r}: containers never run as root (uid/gid 0)")
        m = _IDS.fullmatch(override)
        if m is None:
            return Refusal(reason=f"{USER_ENV}={override!r}: expected numeric uid:gid (e.g. 1000:1000)")
        uid, gid = int(m[1]), int(m[2])
        if uid > _MAX_ID or gid > _MAX_ID:
            return Refusal(reason=f"{USER_ENV}={override!r}: id out of range")
        return f"{uid}:{gid}", ()
    if account is None:
        return NOBODY, ()
    if account.uid == 0 or account.gid == 0:
        return Refusal(reason=f"account {account.name!r} is uid/gid 0: containers never run as root")
    groups = tuple(str(g) for g in account.groups if g not in (0, account.gid))
    return f"{account.uid}:{account.gid}", groups


def container_spec(
    spec: JobSpec,
    *,
    node: str,
    job_dir: Path,
    checkpoint_dir: Path,
    device_exists: Callable[[str], bool],
    account: PosixAccount | None,
    policy: ContainerPolicy,
) -> ContainerSpec | Refusal:
    """Pure: the container for one job attempt, or why it may not run (``device_exists``
    is the only probe of the host, passed in)."""
    assert spec.image is not None
    who = container_user(spec, account=account, policy=policy)
    if isinstance(who, Refusal):
        return who
    user, groups = who
    env = launch_env(
        spec,
        node=node,
        checkpoint_dir="/checkpoint",
        hostfile="/work/.gpufleet-hostfile",
        base={},
        submit_dir="/work",
    )
    gpu_devices = [f"/dev/nvidia{i}" for i in spec.gpus]
    devices = [*gpu_devices, *(d for d in CONTROL_DEVICES if device_exists(d))]
    name = container_name(node, spec)
    labels = {"gpufleet.job": str(spec.job_id), "gpufleet.attempt": str(spec.attempt), "gpufleet.node": node}
    network_mode: str | None = None
    network: str | None = None
    job_network: NetworkSpec | None = None
    ports: dict[str, int] = {}
    host_port = spec.env.get("GPUFLEET_HOST_PORT")
    if host_port is not None and host_port.isdigit():  # a service replica: publish its port
        inside = env.get("GPUFLEET_SERVICE_PORT", "8000")
        ports[f"{inside}/tcp"] = int(host_port)
        env["PORT"] = inside
    if len(spec.peers) > 1:
        if policy.network:
            network = policy.network
        elif policy.host_network:
            network_mode = "host"
        else:
            job_network = NetworkSpec(name=name, labels=labels)
            network = name
            if spec.node_rank == 0:
                ports = {f"{spec.master_port}/tcp": spec.master_port}
    return ContainerSpec(
        name=name,
        image=spec.image,
        command=spec.command,
        environment=env,
        devices=tuple(f"{d}:{d}:rwm" for d in devices),
        user=user,
        group_add=groups,
        cap_add=tuple(policy.allowed_caps),
        pids_limit=policy.pids_max,
        mem_limit=policy.memory_max_bytes,
        nano_cpus=None if policy.cpus is None else round(policy.cpus * 1e9),
        read_only=policy.read_only_rootfs,
        tmpfs={"/tmp": TMPFS_OPTIONS} if policy.read_only_rootfs else {},
        volumes={
            str(job_dir / "run"): {"bind": "/work", "mode": "rw"},
            str(checkpoint_dir): {"bind": "/checkpoint", "mode": "rw"},
        },
        network_mode=network_mode,
        network=network,
        job_network=job_network,
        ports=ports,
        labels=labels,
        runtime=policy.runtime,
    )


# -- the Docker client seam ---------------------------------------------------------------------


class DockerContainer(Protocol):
    @property
    def attrs(self) -> Mapping[str, Any]: ...

    def logs(self, *, stdout: bool, stderr: bool) -> bytes: ...

    def kill(self, *, signal: str) -> Any: ...

    def remove(self, *, force: bool) -> Any: ...


class DockerNetwork(Protocol):
    @property
    def attrs(self) -> Mapping[str, Any]: ...

    def remove(self) -> Any: ...


class DockerContainers(Protocol):
    def run(self, **kwargs: Any) -> Any: ...

    def get(self, container_id: str) -> DockerContainer: ...


class DockerNetworks(Protocol):
    def create(self, name: str, **kwargs: Any) -> Any: ...

    def get(self, network_id: str) -> DockerNetwork: ...


class DockerClient(Protocol):
    """The part of ``docker.DockerClient`` the runner uses."""

    @property
    def containers(self) -> DockerContainers: ...

    @property
    def networks(self) -> DockerNetworks: ...


def _write_new(path: Path, text: str) -> None:
    """Write a fresh file in a directory the job's owner controls: never through a link
    the owner may have left there (the agent may be root)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def load_docker() -> Any:
    """A Docker client, or None when the SDK or the engine is missing."""
    try:
        docker = importlib.import_module("docker")
        client = docker.from_env()
        client.ping()
        return client
    except Exception:
        return None


class ContainerRunner:
    kind = "container"

    def __init__(
        self,
        store: JobStore,
        *,
        node: str,
        policy: ContainerPolicy = ContainerPolicy(),
        run_as: RunAs | None = None,
        client: DockerClient | None = None,
    ) -> None:
        self.store = store
        self.node = node
        self.policy = policy
        self.run_as = run_as
        self._client = client

    @property
    def client(self) -> DockerClient | None:
        if self._client is None:
            self._client = load_docker()
        return self._client

    def start(self, spec: JobSpec, *, now: float) -> LocalJob:
        job = LocalJob(
            job_id=spec.job_id,
            attempt=spec.attempt,
            kind=self.kind,
            gpus=spec.gpus,
            dir=str(self.store.job_dir(spec.job_id, spec.attempt)),
            started_at=now,
            container=container_name(self.node, spec),
        )
        try:
            return self._start(spec, job)
        except Exception as exc:  # a bug or a broken node: this job fails, the agent goes on
            log.exception("container job %s/%s could not start", spec.job_id, spec.attempt)
            return self._fail(job, f"cannot start the job: {exc}", ENGINE_MISSING)

    def _start(self, spec: JobSpec, job: LocalJob) -> LocalJob:
        account = self.run_as.resolve(spec.user) if self.run_as is not None else None
        privileged = self.run_as is not None and self.run_as.privileged
        owner = account if isinstance(account, PosixAccount) and privileged else None
        d, paths = _prepare(self.store, spec, self.node, owner)  # run/, checkpoints: the owner's
        _private(job.log_path)
        if isinstance(account, Refusal):
            return self._fail(job, f"not started: {account.reason}", REFUSED)
        _write_new(d / "run" / ".gpufleet-hostfile", Path(paths["hostfile"]).read_text())
        cs = container_spec(
            spec,
            node=self.node,
            job_dir=d,
            checkpoint_dir=Path(paths["checkpoint_dir"]),
            device_exists=lambda p: Path(p).exists(),
            account=account,
            policy=self.policy,
        )
        if isinstance(cs, Refusal):
            return self._fail(job, f"not started: {cs.reason}", REFUSED)
        client = self.client
        if client is None:
            return self._fail(job, "no Docker engine on this node (container jobs need one)", ENGINE_MISSING)
        if cs.job_network is not None:
            try:
                client.networks.get(cs.job_network.name)
            except Exception:  # not there yet (docker.errors.NotFound), the usual case
                try:
                    client.networks.create(**cs.job_network.docker_kwargs())
                except Exception as exc:
                    return self._fail(job, f"cannot create the job's network: {exc}", ENGINE_MISSING)
        try:
            client.containers.run(**cs.docker_kwargs())
        except Exception as exc:  # the SDK's errors: image not found, bad options...
            return self._fail(job, f"cannot start container: {exc}", ENGINE_MISSING)
        return job

    def _fail(self, job: LocalJob, why: str, code: int) -> LocalJob:
        """Over before a container exists: the reason is the whole log. (Nothing may be
        written before a container's output: ``poll`` rewrites the log with it.)"""
        with contextlib.suppress(OSError), open(job.log_path, "a") as f:
            f.write(f"gpufleet: {why}\n")
        return dataclasses.replace(job, exit_code=code)

    def _container(self, job: LocalJob) -> DockerContainer | None:
        client = self.client
        if client is None or job.container is None:
            return None
        try:
            return client.containers.get(job.container)
        except Exception:
            return None

    def poll(self, job: LocalJob, *, now: float) -> int | None:
        if job.exit_code is not None:
            return job.exit_code
        c = self._container(job)
        if c is None:
            return 255
        with contextlib.suppress(Exception):
            job.log_path.write_bytes(c.logs(stdout=True, stderr=True))
        try:
            state = c.attrs.get("State", {})
            if state.get("Running") or state.get("Status") in ("created", "restarting"):
                return None
            return int(state.get("ExitCode", 255))
        except Exception:  # an answer we cannot read: ask again next tick
            log.warning("container %s: unreadable state", job.container, exc_info=True)
            return None

    def stop(self, job: LocalJob, *, now: float, grace_s: float) -> LocalJob:
        c = self._container(job)
        if c is None:
            return job
        try:
            if job.stop_requested_at is None:
                c.kill(signal="SIGTERM")
                return dataclasses.replace(job, stop_requested_at=now)
            if now - job.stop_requested_at >= grace_s:
                c.kill(signal="SIGKILL")
                return dataclasses.replace(job, killed=True)
        except Exception:
            pass
        return job

    def send_signal(self, job: LocalJob, *, signum: int, batch_only: bool) -> str | None:
        """To the container's main process (the engine signals that one only, ``B:`` or
        not; see the module's docstring)."""
        c = self._container(job)
        if c is None:
            return "no such container"
        try:
            c.kill(signal=signal.Signals(signum).name)
        except Exception as exc:  # the SDK's errors: not running, engine gone...
            return f"cannot signal the container: {exc}"
        return None

    def recover(self, job: LocalJob) -> LocalJob:
        """A container is found by its name (``container_name``); one started twice
        under that name is refused by the engine, so nothing to mend here."""
        return job

    def release(self, job: LocalJob) -> None:
        """Removes the container, then the job's own network if it has one (only a
        network labelled as this job's: never the operator's)."""
        c = self._container(job)
        if c is not None:
            with contextlib.suppress(Exception):
                c.remove(force=True)
        client = self.client
        if client is None or job.container is None:
            return
        with contextlib.suppress(Exception):  # most jobs have none: NotFound
            net = client.networks.get(job.container)
            labels = net.attrs.get("Labels") or {}
            if labels.get("gpufleet.job") == str(job.job_id) and labels.get("gpufleet.node") == self.node:
                net.remove()
