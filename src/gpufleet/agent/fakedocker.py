"""An in-package double of the Docker client, for the container runner's tests:
containers that "run" until told to exit, networks that refuse removal while in use, the
same ``containers.run/get`` and ``networks.create/get`` shape as the docker SDK."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class FakeContainer:
    """A container that "runs" until ``exit_code`` is set; ``kills`` records signals."""

    kwargs: dict[str, Any]
    exit_code: int | None = None
    output: bytes = b""
    kills: list[str] = field(default_factory=list)
    removed: bool = False

    @property
    def attrs(self) -> Mapping[str, Any]:
        if self.exit_code is None:
            return {"State": {"Status": "running", "Running": True}}
        return {"State": {"Status": "exited", "Running": False, "ExitCode": self.exit_code}}

    def logs(self, *, stdout: bool, stderr: bool) -> bytes:
        return self.output

    def kill(self, *, signal: str) -> None:
        self.kills.append(signal)

    def remove(self, *, force: bool) -> None:
        self.removed = True


@dataclass(slots=True)
class FakeNetwork:
    """Refuses removal while a container is attached, as the engine does."""

    engine: FakeDocker
    kwargs: dict[str, Any]
    removed: bool = False

    @property
    def attrs(self) -> Mapping[str, Any]:
        return {"Name": self.kwargs["name"], "Labels": self.kwargs.get("labels") or {}}

    def remove(self) -> None:
        name = self.kwargs["name"]
        if any(c.kwargs.get("network") == name and not c.removed for c in self.engine.ran.values()):
            raise RuntimeError(f"network {name} has active endpoints")
        self.removed = True


class FakeDocker:
    """An in-memory Docker engine with the SDK's shape (``containers.run/get``,
    ``networks.create/get``): ``ran`` and ``made`` hold what was created, by name;
    ``fail_run`` makes ``containers.run`` raise it. Unknown or removed objects raise
    ``LookupError`` (the SDK: ``NotFound``)."""

    def __init__(self, *, fail_run: str | None = None) -> None:
        self.fail_run = fail_run
        self.ran: dict[str, FakeContainer] = {}
        self.made: dict[str, FakeNetwork] = {}
        self.containers = _FakeContainers(self)
        self.networks = _FakeNetworks(self)


@dataclass(slots=True)
class _FakeContainers:
    engine: FakeDocker

    def run(self, **kwargs: Any) -> FakeContainer:
        if self.engine.fail_run is not None:
            raise RuntimeError(self.engine.fail_run)
        net = kwargs.get("network")
        if net and (net not in self.engine.made or self.engine.made[net].removed):
            raise LookupError(f"network {net} not found")
        c = self.engine.ran[kwargs["name"]] = FakeContainer(kwargs=kwargs)
        return c

    def get(self, container_id: str) -> FakeContainer:
        c = self.engine.ran.get(container_id)
        if c is None or c.removed:
            raise LookupError(f"no such container: {container_id}")
        return c


@dataclass(slots=True)
class _FakeNetworks:
    engine: FakeDocker

    def create(self, name: str, **kwargs: Any) -> FakeNetwork:
        if name in self.engine.made and not self.engine.made[name].removed:
            raise RuntimeError(f"network with name {name} already exists")
        n = self.engine.made[name] = FakeNetwork(engine=self.engine, kwargs={"name": name, **kwargs})
        return n

    def get(self, network_id: str) -> FakeNetwork:
        n = self.engine.made.get(network_id)
        if n is None or n.removed:
            raise LookupError(f"network {network_id} not found")
        return n
