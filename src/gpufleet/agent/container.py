"""Container jobs (``--image``) through the Docker Engine API (``docker`` SDK).

The container's shape is a pure function, ``container_spec``, so what matters for
safety is tested as data: never privileged, ``no-new-privileges``, all capabilities
dropped (``allowed_caps`` adds back only what the operator allows), only the assigned
``/dev/nvidiaN`` plus the control devices that exist, a non-root user (65534:65534,
"nobody") unless the job sets ``GPUFLEET_CONTAINER_USER``. The job dir's ``run/`` is
``/work`` and the checkpoint dir ``/checkpoint`` inside. Multi-node jobs use the
host's network (NCCL needs the peers' addresses); single-node jobs the default bridge.

``ContainerRunner`` drives it; the SDK is imported on first use, and a node without a
Docker engine fails such jobs with a clear line in their log (exit 125, as docker run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.agent.jobs import JobSpec, JobStore, LocalJob, launch_env
from gpufleet.agent.runners import _prepare

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
NOBODY = "65534:65534"
USER_ENV = "GPUFLEET_CONTAINER_USER"
ENGINE_MISSING = 125


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSpec:
    name: str
    image: str
    command: tuple[str, ...]
    environment: Mapping[str, str]
    devices: tuple[str, ...]
    user: str = NOBODY
    privileged: bool = False
    cap_drop: tuple[str, ...] = ("ALL",)
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ("no-new-privileges",)
    working_dir: str = "/work"
    volumes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    network_mode: str | None = None
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
            "working_dir": self.working_dir,
            "volumes": {k: dict(v) for k, v in self.volumes.items()},
            "labels": dict(self.labels),
            "detach": True,
        }
        if self.cap_add:
            kw["cap_add"] = list(self.cap_add)
        if self.network_mode:
            kw["network_mode"] = self.network_mode
        if self.runtime:
            kw["runtime"] = self.runtime
        return kw


def container_spec(
    spec: JobSpec,
    *,
    node: str,
    job_dir: Path,
    checkpoint_dir: Path,
    device_exists: Callable[[str], bool],
    allowed_caps: tuple[str, ...] = (),
    runtime: str | None = None,
) -> ContainerSpec:
    """Pure: the container for one job attempt (``device_exists`` is the only probe of
    the host, passed in)."""
    assert spec.image is not None
    env = launch_env(
        spec,
        node=node,
        checkpoint_dir="/checkpoint",
        hostfile="/work/.gpufleet-hostfile",
        base={},
    )
    gpu_devices = [f"/dev/nvidia{i}" for i in spec.gpus]
    devices = [*gpu_devices, *(d for d in CONTROL_DEVICES if device_exists(d))]
    user = spec.env.get(USER_ENV, "").strip() or NOBODY
    return ContainerSpec(
        name=f"gpufleet-{node}-{spec.job_id}-{spec.attempt}",
        image=spec.image,
        command=spec.command,
        environment=env,
        devices=tuple(f"{d}:{d}:rwm" for d in devices),
        user=user,
        cap_add=tuple(allowed_caps),
        volumes={
            str(job_dir / "run"): {"bind": "/work", "mode": "rw"},
            str(checkpoint_dir): {"bind": "/checkpoint", "mode": "rw"},
        },
        network_mode="host" if len(spec.peers) > 1 else None,
        labels={
            "gpufleet.job": str(spec.job_id),
            "gpufleet.attempt": str(spec.attempt),
            "gpufleet.node": node,
        },
        runtime=runtime,
    )


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
        client: Any = None,
        allowed_caps: tuple[str, ...] = (),
        runtime: str | None = None,
    ) -> None:
        self.store = store
        self.node = node
        self.allowed_caps = allowed_caps
        self.runtime = runtime
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = load_docker()
        return self._client

    def start(self, spec: JobSpec, *, now: float) -> LocalJob:
        d, paths = _prepare(self.store, spec, self.node)
        (d / "run" / ".gpufleet-hostfile").write_text(Path(paths["hostfile"]).read_text())
        cs = container_spec(
            spec,
            node=self.node,
            job_dir=d,
            checkpoint_dir=Path(paths["checkpoint_dir"]),
            device_exists=lambda p: Path(p).exists(),
            allowed_caps=self.allowed_caps,
            runtime=self.runtime,
        )
        job = LocalJob(
            job_id=spec.job_id,
            attempt=spec.attempt,
            kind=self.kind,
            gpus=spec.gpus,
            dir=str(d),
            started_at=now,
            container=cs.name,
        )
        client = self.client
        if client is None:
            return self._fail(job, "no Docker engine on this node (container jobs need one)")
        try:
            client.containers.run(**cs.docker_kwargs())
        except Exception as exc:  # the SDK's errors: image not found, bad options...
            return self._fail(job, f"cannot start container: {exc}")
        return job

    def _fail(self, job: LocalJob, why: str) -> LocalJob:
        with open(job.log_path, "a") as f:
            f.write(f"gpufleet: {why}\n")
        return dataclasses.replace(job, exit_code=ENGINE_MISSING)

    def _container(self, job: LocalJob) -> Any:
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
        state = c.attrs.get("State", {})
        if state.get("Running") or state.get("Status") in ("created", "restarting"):
            return None
        return int(state.get("ExitCode", 255))

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

    def release(self, job: LocalJob) -> None:
        c = self._container(job)
        if c is not None:
            with contextlib.suppress(Exception):
                c.remove(force=True)
