"""Built-in alerts: the rules (a table of fleet states), the Alertmanager-format messages,
delivery with retries to a loopback HTTP receiver, the sender as a loop on the runner (a
transport that raises is a counted failure the loop carries on from; it stops after the
rules' loop and delivers what that loop handed it last), and a server started with
``alert_webhook`` posting GpuHot for a hot GPU."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.server.loops.alerts import (
    Alert,
    AlertRules,
    AlertTracker,
    WebhookSender,
    alert_loop,
    evaluate,
)
from gpufleet.server.runner import Loops, Runner
from gpufleet.server.services.dashboard import FleetView, GpuInfo, NodeInfo, QueueStat, TeamSpend
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.telemetry import RecordingTelemetryStore
from web.fleetapp import fleet

NOW = 10_000.0


def view(*, ready: bool = True, oldest: float | None = None, spend: tuple[TeamSpend, ...] = ()) -> FleetView:
    return FleetView(
        at=NOW,
        nodes=(NodeInfo(name="n1", pool="p", leaf="l", rack="r", cordoned=False, ready=ready),),
        gpus=(GpuInfo(node="n1", index=0, uuid="GPU-0", model="H100", memory_mb=80_000, healthy=True),),
        held={},
        jobs={},
        queues=() if oldest is None else (QueueStat(pool="p", pending=3, oldest_since=oldest),),
        spend=spend,
    )


def spent(cost: float, *, soft: float | None = None, hard: float | None = 100.0) -> tuple[TeamSpend, ...]:
    return (TeamSpend(team="t", cost=cost, gpu_hours=1, energy_kwh=1, budget_soft=soft, budget_hard=hard),)


def hot_state(**tel: Any) -> AgentState:
    hot = AgentState(telemetry=RecordingTelemetryStore())
    if tel:
        hot.telemetry.put(
            "n1", at=NOW, gpus=[GpuTelemetry(index=0, **tel)], driver_version=None, cuda_version=None
        )
    return hot


@pytest.mark.parametrize(
    ("fleet_view", "hot", "want"),
    [
        (view(), hot_state(temperature_c=60.0), []),
        (view(), hot_state(temperature_c=85.0), [("GpuHot", "warning")]),
        (view(), hot_state(temperature_c=40.0, xid_events=[79]), [("GpuFatalXid", "critical")]),
        (view(), hot_state(temperature_c=40.0, xid_events=[13]), []),
        (view(ready=False), hot_state(), [("NodeNotReady", "critical")]),
        (view(oldest=NOW - 3600), hot_state(), [("QueueWaitHigh", "warning")]),
        (view(oldest=NOW - 60), hot_state(), []),
        (view(spend=spent(89.0)), hot_state(), []),
        (view(spend=spent(90.0)), hot_state(), [("BudgetNearLimit", "warning")]),
        (view(spend=spent(100.0)), hot_state(), [("BudgetExhausted", "critical")]),
        (view(spend=spent(500.0, soft=10.0, hard=None)), hot_state(), []),
        (view(spend=spent(0.0, hard=0.0)), hot_state(), [("BudgetExhausted", "critical")]),
    ],
    ids=[
        "healthy", "hot", "fatal-xid", "benign-xid", "not-ready", "queue-wait", "short-wait",
        "budget-89pct", "budget-90pct", "budget-spent", "soft-budget-only", "zero-hard-budget",
    ],
)  # fmt: skip
def test_rules(fleet_view: FleetView, hot: AgentState, want: list[tuple[str, str]]) -> None:
    got = evaluate(fleet_view, hot, rules=AlertRules(queue_wait_s=1800))
    assert [(a.name, a.severity) for a in got] == want


def test_budget_alert_names_the_team_and_the_spend() -> None:
    (a,) = evaluate(view(spend=spent(95.0)), hot_state())
    assert a.label_map() == {"alertname": "BudgetNearLimit", "team": "t", "severity": "warning"}
    assert a.summary == "team t has spent 95.00 of its monthly hard budget 100.00"


def test_tracker_fires_once_then_resolves() -> None:
    t = AlertTracker(external_url="http://gpufleet")
    a = Alert(name="GpuHot", labels=(("node", "n1"), ("gpu", "0")), severity="warning", summary="hot")
    first = t.update([a], now=NOW)
    assert len(first) == 1 and first[0]["status"] == "firing" and first[0]["version"] == "4"
    assert first[0]["groupLabels"] == {"alertname": "GpuHot"}
    item = first[0]["alerts"][0]
    assert item["labels"] == {"alertname": "GpuHot", "node": "n1", "gpu": "0", "severity": "warning"}
    assert item["endsAt"] == "0001-01-01T00:00:00Z" and item["fingerprint"] == a.fingerprint
    assert t.update([a], now=NOW + 15) == []  # unchanged: nothing sent
    done = t.update([], now=NOW + 30)
    assert done[0]["status"] == "resolved" and done[0]["alerts"][0]["endsAt"].startswith(
        "1970-01-01T02:47:10"
    )


class Receiver:
    """A loopback Alertmanager-webhook receiver that fails the first ``fail`` posts."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.posts: list[dict[str, Any]] = []
        self.attempts = 0
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                me.attempts += 1
                if me.attempts <= me.fail:
                    self.send_response(503)
                else:
                    me.posts.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 10) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.posts) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.posts

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = Receiver(fail=getattr(request, "param", 0))
    yield r
    r.close()


@pytest.mark.parametrize("receiver", [0, 2], indirect=True, ids=["first-try", "after-2-failures"])
def test_webhook_delivery_retries_with_backoff(receiver: Receiver) -> None:
    sender = WebhookSender(receiver.url, backoff_s=0.05, attempts=4)
    sender.start()
    try:
        sender.send({"status": "firing", "alerts": []})
        assert receiver.wait(1) == [{"status": "firing", "alerts": []}]
        assert receiver.attempts == receiver.fail + 1
    finally:
        sender.stop()
    assert sender.delivered == 1 and sender.dropped == 0 and sender.failures == 0


def test_webhook_gives_up_after_attempts(receiver: Receiver) -> None:
    receiver.fail = 100
    sender = WebhookSender(receiver.url, backoff_s=0.01, attempts=3)
    sender.start()
    sender.send({"status": "firing"})
    deadline = time.monotonic() + 5
    while sender.dropped == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    sender.stop()
    assert receiver.attempts == 3 and sender.dropped == 1
    assert sender.failures == 0  # a receiver's refusal is the message's fate, not the loop's failure


class Flaky(httpx.BaseTransport):
    """A transport that raises a non-HTTP error (a bug, not a receiver's answer) on the
    posts numbered in ``broken`` and answers 200 to the others."""

    def __init__(self, broken: set[int]) -> None:
        self.broken = broken
        self.posts: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.posts.append(json.loads(request.content))
        if len(self.posts) in self.broken:
            raise RuntimeError("transport bug")
        return httpx.Response(200)


def test_a_raising_transport_is_a_counted_failure_and_the_sender_carries_on() -> None:
    flaky = Flaky(broken={1})
    sender = WebhookSender("http://receiver/hook", transport=flaky, interval_s=0.01)
    sender.start()
    try:
        sender.send({"n": 1})
        sender.send({"n": 2})
        deadline = time.monotonic() + 5
        while sender.delivered + sender.dropped < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        sender.send({"n": 3})  # the loop is still alive
        while sender.delivered < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sender.stop()
    assert [p["n"] for p in flaky.posts] == [1, 2, 3]  # in order, none posted twice
    assert (sender.failures, sender.dropped, sender.delivered) == (1, 1, 2)
    assert not sender.loop._thread or not sender.loop._thread.is_alive()


class Logged:
    """A runner that notes its stop in ``log``, then stops ``inner``."""

    def __init__(self, inner: Runner, log: list[str]) -> None:
        self.inner, self.log, self.name = inner, log, inner.name

    @property
    def passes(self) -> int:
        return self.inner.passes

    @property
    def failures(self) -> int:
        return self.inner.failures

    def start(self) -> None:
        self.inner.start()

    def wake(self) -> None:
        self.inner.wake()

    def stop(self) -> None:
        self.log.append(self.name)
        self.inner.stop()


class Slow(Flaky):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        time.sleep(0.1)
        return super().handle_request(request)


def test_the_sender_stops_after_the_rules_loop_and_delivers_its_last_messages() -> None:
    """``Loops`` stops in reverse: the rules' loop (added after the sender, as
    ``loops/build.py`` does) ends first; what it handed over just before still goes out
    (the sender's ``stop`` drains its queue)."""
    slow = Slow(broken=set())
    sender = WebhookSender("http://receiver/hook", transport=slow)
    fleet_view = view(ready=False, oldest=NOW - 7200)  # two alert names: two messages
    rules = alert_loop(
        view=lambda: fleet_view, hot=AgentState(), sender=sender, rules=AlertRules(), interval_s=60
    )
    stopped: list[str] = []
    loops = Loops([Logged(sender, stopped), Logged(rules, stopped)])
    loops.start()
    rules.wake()
    deadline = time.monotonic() + 5
    while rules.passes == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    loops.stop()  # at once: the first message is still in flight
    assert stopped == ["alerts", "alert-webhook"]
    assert sorted(p["groupLabels"]["alertname"] for p in slow.posts) == ["NodeNotReady", "QueueWaitHigh"]
    assert sender.delivered == 2 and sender.dropped == 0 and sender.failures == 0


def test_stop_gives_up_on_a_receiver_that_is_down_after_drain_s() -> None:
    down = httpx.MockTransport(lambda request: httpx.Response(503))
    sender = WebhookSender("http://receiver/hook", transport=down, backoff_s=10.0, drain_s=0.2)
    sender.start()
    sender.send({"status": "firing"})
    t0 = time.monotonic()
    sender.stop()
    assert time.monotonic() - t0 < 3.0  # not the 10 s backoff
    assert sender.dropped == 1 and sender.delivered == 0


def test_server_posts_builtin_alerts(tmp_path: Path, receiver: Receiver) -> None:
    with fleet(tmp_path, alert_webhook=receiver.url, alert_interval_s=0.1):
        posts = receiver.wait(2)
    by_name = {p["groupLabels"]["alertname"]: p for p in posts}
    assert {"GpuHot", "GpuFatalXid"} <= set(by_name)
    hot = by_name["GpuHot"]
    assert hot["status"] == "firing" and hot["receiver"] == "gpufleet"
    assert [a["labels"]["node"] + "/" + a["labels"]["gpu"] for a in hot["alerts"]] == ["node-a/0"]
