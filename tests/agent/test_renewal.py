"""When an idle agent renews its lease instead of syncing (``agent/renewal.py``): the
telemetry dead bands and the body it compares, as tables; what a refused or failed
renewal does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import AgentConfig, SimSpec, SimulatedProbe, make_agent
from gpufleet.agent.renewal import Renewals, renewed, same_telemetry
from gpufleet.agent.transport import AgentTransportError


def _gpu(**over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "index": 0,
        "utilization_pct": 0.0,
        "memory_used_mb": 0,
        "temperature_c": 35.0,
        "power_w": 70.0,
        "sm_clock_mhz": 345,
        "ecc_sbe": 0,
        "xid_events": [],
        "health": [],
    }
    return row | over


def _body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "gpus": [{"index": 0, "uuid": "GPU-0", "healthy": True}],
        "telemetry": [_gpu()],
        "jobs": [],
        "logs": [],
        "leaf": "leaf-0",
    }
    return body | over


@pytest.mark.parametrize(
    ("new", "same"),
    [
        (_gpu(), True),
        (_gpu(temperature_c=37.9, power_w=79.0, utilization_pct=4.0), True),
        (_gpu(temperature_c=38.5), False),
        (_gpu(power_w=80.5), False),
        (_gpu(memory_used_mb=600), False),
        (_gpu(ecc_sbe=1), False),
        (_gpu(xid_events=[13]), False),
        (_gpu(health=["temperature"]), False),
        (_gpu(temperature_c=None), False),
        ({k: v for k, v in _gpu().items() if k != "sm_clock_mhz"}, False),
    ],
    ids=[
        *("equal", "in-bands", "temp-out", "power-out", "memory-out"),
        *("ecc", "xid", "health", "gone", "no-key"),
    ],
)
def test_telemetry_dead_bands(new: dict[str, Any], same: bool) -> None:
    assert same_telemetry([_gpu()], [new]) is same


@pytest.mark.parametrize(
    ("body", "renews"),
    [
        (_body(), True),
        (_body(telemetry=[_gpu(temperature_c=36.0)]), True),
        (_body(leaf="leaf-1"), False),
        (_body(gpus=[{"index": 0, "uuid": "GPU-0", "healthy": False}]), False),
        (_body(jobs=[{"job_id": 1, "attempt": 1, "state": "running"}]), False),
        (_body(logs=[{"job_id": 1, "attempt": 1, "offset": 0, "data": "x"}]), False),
        (_body(preflight={"findings": []}), False),
        (_body(telemetry=[_gpu(), _gpu(index=1)]), False),
    ],
    ids=["same", "drift", "moved-leaf", "gpu-unhealthy", "a-job", "a-log", "preflight", "new-gpu"],
)
def test_what_a_lease_stands_for(body: dict[str, Any], renews: bool) -> None:
    r = Renewals()
    r.granted(_body(), "L1")
    assert (r.lease_for(body) == "L1") is renews


def test_no_lease_without_one_granted_or_for_a_busy_body() -> None:
    r = Renewals()
    assert r.lease_for(_body()) is None
    r.granted(_body(), None)  # the server gave none
    assert r.lease_for(_body()) is None
    r.granted(_body(jobs=[{"job_id": 1}]), "L1")  # a lease never stands for a body with work
    assert r.lease_for(_body()) is None


class _Server:
    def __init__(self, answer: bool | int) -> None:
        self.answer = answer
        self.renewals: list[tuple[str, str]] = []

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("not here")

    def renew(self, node: str, lease: str) -> bool:
        self.renewals.append((node, lease))
        if isinstance(self.answer, bool):
            return self.answer
        raise AgentTransportError("refused", status=self.answer)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("answer", "ok", "lease_after", "off"),
    [(True, True, "L1", False), (False, False, None, False), (404, False, None, True)],
    ids=["renewed", "refused-sync-in-full", "older-server"],
)
def test_renewed(answer: bool | int, ok: bool, lease_after: str | None, off: bool) -> None:
    r = Renewals()
    r.granted(_body(), "L1")
    server = _Server(answer)
    assert renewed(r, server, "n1", _body()) is ok
    assert server.renewals == [("n1", "L1")]
    assert r.lease_for(_body()) == lease_after
    assert r.off is off


def test_a_failed_renewal_raises_and_the_next_sync_is_full() -> None:
    r = Renewals()
    r.granted(_body(), "L1")
    with pytest.raises(AgentTransportError):
        renewed(r, _Server(503), "n1", _body())
    assert r.lease_for(_body()) is None
    assert not r.off


class _PushedWhileBuilding(SimulatedProbe):
    """A probe whose sample (taken while the agent builds a sync's body) lets the
    doorbell ring first, as a new agent's first long-poll can answer during its first
    sync."""

    ring: Any = None

    def sample(self) -> Any:
        if self.ring is not None:
            ring, self.ring = self.ring, None
            ring()
        return super().sample()


class _Recorder:
    def __init__(self) -> None:
        self.syncs = 0

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        self.syncs += 1
        return {"node": node, "jobs": []}

    def close(self) -> None:
        pass


def test_a_push_while_a_sync_is_built_asks_for_the_next_sync(tmp_path: Path) -> None:
    """The push may stand for a change the body being built predates: it is not wiped
    with the flags of the sync under way (it once was, and a new agent then waited its
    full sync interval; ``tests/agent/test_push.py``'s set-up failed now and then)."""
    probe = _PushedWhileBuilding(node="n1", spec=SimSpec(gpus=1))
    server = _Recorder()
    config = AgentConfig(node="n1", work_dir=tmp_path / "n1", sync_interval_s=60.0)
    agent = make_agent(config=config, probe=probe, transport=server)
    agent.step()  # the first sync (due at once)
    assert server.syncs == 1 and not agent.due(time.monotonic())
    probe.ring = agent._ring
    agent._ring()  # a push: sync now
    agent.step()  # builds (the doorbell rings again meanwhile), syncs
    assert server.syncs == 2
    assert agent.due(time.monotonic())  # the push during the build asks for one more
    agent.step()
    assert server.syncs == 3 and not agent.due(time.monotonic())
