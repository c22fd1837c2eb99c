"""The notifications between servers (``gpufleet.server.store.pgnotify``) without a database:
payloads for node rings fit PostgreSQL's limit and come back whole; a server ignores its
own and garbled ones; relayed readings and gateway reports land in the receiving server's
memory (a leader's health rules then see them), older readings never replace newer ones,
and readings too large for one payload are counted, not sent."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import create_engine

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.api.services import ServiceCounters
from gpufleet.server.decide.health import HealthMonitor, HealthRules
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.pgnotify import MAX_PAYLOAD, PgNotify, parse, pieces


def test_ring_payloads_fit_and_come_back_whole() -> None:
    nodes = {f"node-{i:05d}-{'x' * 40}" for i in range(600)}
    got = pieces("me", nodes)
    assert len(got) > 1 and all(len(p.encode()) <= MAX_PAYLOAD for p in got)
    back: set[str] = set()
    for p in got:
        kind, body = parse(p, "other") or ("", "")
        assert kind == "t"
        back |= set(body.split(","))
    assert back == nodes


def test_own_and_garbled_payloads_are_ignored() -> None:
    assert parse("me|w|scheduling", "me") is None
    assert parse("garbage", "me") is None
    assert parse("a|x|y", "me") is None
    assert parse("a|w|scheduling", "me") == ("w", "scheduling")


class _Sent:
    """A PgNotify never started: what its sender would send is read directly."""

    def __init__(self) -> None:
        self.n = PgNotify(create_engine("sqlite://"), "postgresql://x", me="a", on_wake=print, on_touch=print)

    def payloads(self) -> list[str]:
        return list(self.n._observed.values())


def _deliver(hot: AgentState, payloads: list[str]) -> None:
    for p in payloads:
        kind, body = parse(p, "b") or ("", "")
        (hot.relayed_telemetry if kind == "m" else hot.relayed_traffic)(json.loads(body))


def test_relayed_readings_reach_the_leaders_health_rules() -> None:
    sent = _Sent()
    fatal = GpuTelemetry(index=1, temperature_c=50.0, xid_events=[79])
    sent.n.telemetry("n1", 100.0, [GpuTelemetry(index=0, temperature_c=40.0)], "550.1", None)
    sent.n.telemetry("n1", 101.0, [fatal], "550.1", None)  # replaces the first: one per node
    counters: dict[str, Any] = {"svc": ServiceCounters(codes={"200": 9, "503": 1}, inflight=2)}
    sent.n.traffic("gw1", 100.0, counters)
    assert len(sent.payloads()) == 2
    leader = AgentState(health=HealthMonitor(HealthRules()))
    _deliver(leader, sent.payloads())
    got = leader.telemetry.get("n1")
    assert got is not None and got.at == 101.0 and got.gpus[1].xid_events == [79]
    assert got.driver_version == "550.1"
    assert ("n1", 1) in leader.health.take()  # the fatal XID fired on the leader
    assert leader.traffic.totals(100.0)["svc"][0] == {"200": 9, "503": 1}  # the gateway's report
    newer = GpuTelemetry(index=0, temperature_c=45.0)
    leader.telemetry_seen("n1", at=200.0, gpus=[newer], driver=None, cuda=None)
    _deliver(leader, [p for p in sent.payloads() if "|m|" in p])  # older: not taken
    assert leader.telemetry.get("n1").at == 200.0  # type: ignore[union-attr]


def test_readings_too_large_for_one_payload_are_counted_not_sent() -> None:
    sent = _Sent()
    big = [GpuTelemetry(index=i, health=["x" * 120] * 32) for i in range(8)]
    sent.n.telemetry("n1", 1.0, big, None, None)
    assert sent.payloads() == [] and sent.n.dropped == 1
