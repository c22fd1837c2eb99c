"""The notifications between servers (``gpufleet.server.store.pgnotify``) without a database:
payloads for node rings fit PostgreSQL's limit and come back whole; a server ignores its
own and garbled ones; relayed readings and gateway reports land in the receiving server's
memory (a leader's health rules then see them), older readings never replace newer ones,
and readings too large for one payload are counted, not sent.

Its two loops on the runner: a NOTIFY the database refuses and a LISTEN that cannot
connect are counted failures the loops carry on from; on PostgreSQL (skipped without
``GPUFLEET_TEST_DATABASE_URL``) a wake-up, a ring and a reading sent by one server's
loop reach another's listening loop, and after its connection is cut it reconnects."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from sqlalchemy import create_engine, text

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


def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_refused_notify_and_a_lost_listen_are_counted_and_the_loops_go_on() -> None:
    n = PgNotify(
        create_engine("sqlite://"),
        "postgresql://nobody@127.0.0.1:1/none",
        me="a",
        on_wake=print,
        on_touch=print,
    )
    n.sender.retry_after_s = n.listener.retry_after_s = 0.01
    for r in n.runners:
        r.start()
    try:
        n.wake("scheduling")  # sqlite has no pg_notify: the step raises
        _until(lambda: n.sender.failures >= 1 and n.listener.failures >= 2)
        n.touch({"n1"})  # the sender still runs after its failure
        _until(lambda: n.sender.failures >= 2)
    finally:
        for r in reversed(n.runners):
            r.stop()
    assert n.sent == 0 and n.listener.passes == 0


def test_two_servers_notify_each_other_and_the_listener_reconnects() -> None:
    url = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if not url:
        pytest.skip("GPUFLEET_TEST_DATABASE_URL not set: PostgreSQL tests skipped")
    engine = create_engine(url)
    got: list[tuple[str, Any]] = []
    a = PgNotify(engine, url, me="a", on_wake=print, on_touch=print)
    b = PgNotify(
        engine,
        url,
        me="b",
        on_wake=lambda loop: got.append(("wake", loop)),
        on_touch=lambda nodes: got.append(("touch", nodes)),
        on_telemetry=lambda body: got.append(("telemetry", body["n"])),
    )
    b.listener.retry_after_s = 0.05
    for r in (*a.runners, *b.runners):
        r.start()
    try:
        _until(lambda: b.listener.passes >= 1)  # listening
        a.wake("replicas")
        a.touch({"n1", "n2"})
        a.telemetry("n1", 1.0, [GpuTelemetry(index=0)], None, None)
        _until(lambda: len(got) == 3)
        assert sorted(got, key=str) == sorted(
            [("wake", "replicas"), ("touch", {"n1", "n2"}), ("telemetry", "n1")], key=str
        )
        assert b._conn is not None
        pid = b._conn.info.backend_pid
        with engine.connect() as c:  # cut b's LISTEN connection: a failed step, then a new one
            c.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        _until(lambda: b.listener.failures >= 1)
        passes = b.listener.passes
        _until(lambda: b.listener.passes > passes)  # listening again
        a.wake("scheduling")
        _until(lambda: ("wake", "scheduling") in got)
    finally:
        for r in (*reversed(b.runners), *reversed(a.runners)):
            r.stop()
        engine.dispose()
    assert a.sender.failures == 0 and a.sent >= 4 and b.received >= 4
