"""Built-in alerts for sites without Alertmanager: a few rules evaluated in the server,
delivered to ``--alert-webhook URL`` as Alertmanager webhook messages (version 4), so
receivers written for Alertmanager (chat bridges, pagers) take them unchanged. The loop
(``alert_loop``, ``--alert-webhook``) evaluates them every ``interval_s`` and hands what
changed to the sender.

Rules (``evaluate``, a pure function of a ``FleetView`` and the hot telemetry):

===================  ========================================================  ========
``GpuHot``           GPU temperature >= ``hot_c`` (85 C)                       warning
``GpuFatalXid``      a fatal XID (``FATAL_XIDS``) in the last ``xid_window_s``  critical
``NodeNotReady``     no sync from the node for the node timeout                critical
``QueueWaitHigh``    a pool's oldest pending job waited >= ``queue_wait_s``    warning
``BudgetNearLimit``  a team spent >= ``budget_ratio`` (90 %) of its hard        warning
                     budget this month, not yet all of it
``BudgetExhausted``  a team spent its hard budget: its new jobs are held        critical
===================  ========================================================  ========

The same rules, for Prometheus, are in ``prometheus/gpufleet-rules.yml``.

State is in memory (``AlertTracker``): after a restart, alerts still true fire again
(receivers dedupe on ``fingerprint``, as with Alertmanager). ``AlertTracker.update``
turns each evaluation into messages, one per alert name whose set changed: new alerts
firing, vanished ones resolved. ``WebhookSender`` posts them in order from a loop of
its own on the runner (``alert-webhook``, woken by each message), retrying with
exponential backoff (a receiver that is down delays, never blocks, the server nor the
rules' loop); a message still undelivered after ``attempts`` is logged and dropped.
``loops/build.py`` starts the sender before the rules' loop (``alerts``), so it stops
after it: the last messages are delivered (for up to ``drain_s``) before it ends.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from gpufleet import __version__
from gpufleet.server.runner import Loop
from gpufleet.server.services.dashboard import HOT_C, FleetView
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.telemetry import FATAL_XIDS, RecordingTelemetryStore

log = logging.getLogger("gpufleet.alerts")
ZERO_TIME = "0001-01-01T00:00:00Z"


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRules:
    hot_c: float = HOT_C
    xid_window_s: float = 600.0
    queue_wait_s: float = 1800.0
    budget_ratio: float = 0.9


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    name: str
    labels: tuple[tuple[str, str], ...]
    severity: str
    summary: str

    @property
    def fingerprint(self) -> str:
        raw = "\0".join(f"{k}={v}" for k, v in (("alertname", self.name), *sorted(self.labels)))
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    def label_map(self) -> dict[str, str]:
        return {"alertname": self.name, **dict(self.labels), "severity": self.severity}


def evaluate(view: FleetView, hot: AgentState, *, rules: AlertRules = AlertRules()) -> list[Alert]:
    out: list[Alert] = []
    store = hot.telemetry
    recorder = store if isinstance(store, RecordingTelemetryStore) else None
    for g in view.gpus:
        tel = store.get(g.node)
        t = tel.gpus.get(g.index) if tel is not None else None
        labels = (("node", g.node), ("gpu", str(g.index)), ("UUID", g.uuid))
        if t is not None and t.temperature_c is not None and t.temperature_c >= rules.hot_c:
            out.append(
                Alert(
                    name="GpuHot",
                    labels=labels,
                    severity="warning",
                    summary=f"GPU {g.index} on {g.node} at {t.temperature_c:.0f} C (>= {rules.hot_c:.0f} C)",
                )
            )
        last = recorder.last_xid(g.node, g.index) if recorder is not None else None
        xid = last.code if last is not None and last.at >= view.at - rules.xid_window_s else None
        if xid is None and t is not None:
            xid = next((x for x in reversed(t.xid_events) if x in FATAL_XIDS), None)
        if xid is not None and xid in FATAL_XIDS:
            out.append(
                Alert(
                    name="GpuFatalXid",
                    labels=(*labels, ("xid", str(xid))),
                    severity="critical",
                    summary=f"GPU {g.index} on {g.node} reported XID {xid}",
                )
            )
    for n in view.nodes:
        if not n.ready:
            out.append(
                Alert(
                    name="NodeNotReady",
                    labels=(("node", n.name), ("pool", n.pool)),
                    severity="critical",
                    summary=f"node {n.name} is NotReady (no sync within the node timeout)",
                )
            )
    for q in view.queues:
        waited = None if q.oldest_since is None else view.at - q.oldest_since
        if waited is not None and waited >= rules.queue_wait_s:
            out.append(
                Alert(
                    name="QueueWaitHigh",
                    labels=(("pool", q.pool),),
                    severity="warning",
                    summary=f"a job in pool {q.pool} has waited {waited / 60:.0f} min ({q.pending} pending)",
                )
            )
    out.extend(_budgets(view, rules))
    return out


def _budgets(view: FleetView, rules: AlertRules) -> list[Alert]:
    """Against the hard budget, the one with a consequence (the soft one warns at submit).
    Exhausted is ``spent >= hard``, as ``BudgetState.over_hard`` holds jobs."""
    out = []
    for t in view.spend:
        hard = t.budget_hard
        if hard is None:
            continue
        spent = f"{t.cost:.2f} of its monthly hard budget {hard:.2f}"
        if t.cost >= hard:
            name, severity, what = "BudgetExhausted", "critical", "; its new jobs are held"
        elif hard > 0 and t.cost >= rules.budget_ratio * hard:
            name, severity, what = "BudgetNearLimit", "warning", ""
        else:
            continue
        out.append(
            Alert(
                name=name,
                labels=(("team", t.team),),
                severity=severity,
                summary=f"team {t.team} has spent {spent}{what}",
            )
        )
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class AlertTracker:
    receiver: str = "gpufleet"
    external_url: str = ""
    _active: dict[str, tuple[Alert, float]] = field(default_factory=dict)

    def update(self, alerts: list[Alert], *, now: float) -> list[dict[str, Any]]:
        """Alertmanager webhook messages for what changed since the last call."""
        current = {a.fingerprint: a for a in alerts}
        fired = {fp: a for fp, a in current.items() if fp not in self._active}
        resolved = {fp: self._active[fp] for fp in self._active if fp not in current}
        for fp, a in fired.items():
            self._active[fp] = (a, now)
        for fp in resolved:
            del self._active[fp]
        changed = {a.name for a in fired.values()} | {a.name for a, _ in resolved.values()}
        messages = []
        for name in sorted(changed):
            items = [self._item(a, since, None) for a, since in self._active.values() if a.name == name]
            items += [self._item(a, since, now) for a, since in resolved.values() if a.name == name]
            messages.append(self._message(name, items))
        return messages

    def _item(self, a: Alert, since: float, ended: float | None) -> dict[str, Any]:
        return {
            "status": "firing" if ended is None else "resolved",
            "labels": a.label_map(),
            "annotations": {"summary": a.summary},
            "startsAt": _iso(since),
            "endsAt": ZERO_TIME if ended is None else _iso(ended),
            "generatorURL": self.external_url,
            "fingerprint": a.fingerprint,
        }

    def _message(self, name: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        firing = [i for i in items if i["status"] == "firing"]
        common = dict(items[0]["labels"])
        for i in items[1:]:
            common = {k: v for k, v in common.items() if i["labels"].get(k) == v}
        summaries = {i["annotations"]["summary"] for i in items}
        return {
            "version": "4",
            "groupKey": f'{{}}:{{alertname="{name}"}}',
            "truncatedAlerts": 0,
            "status": "firing" if firing else "resolved",
            "receiver": self.receiver,
            "groupLabels": {"alertname": name},
            "commonLabels": common,
            "commonAnnotations": {"summary": summaries.pop()} if len(summaries) == 1 else {},
            "externalURL": self.external_url,
            "alerts": items,
        }


class WebhookSender:
    """Posts messages in order from its loop (a ``runner.Runner``); ``transport`` is for
    tests. A step delivers every queued message, each with its retries; a message whose
    delivery raised (a broken transport: a bug, not a receiver's answer) is dropped and
    the step's failure is the loop's (counted; the rest wait one ``interval_s``)."""

    name = "alert-webhook"

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 6,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        timeout_s: float = 10.0,
        drain_s: float = 5.0,
        interval_s: float = 1.0,
        max_queued: int = 10_000,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``drain_s``: how long ``stop`` lets the queued messages go out (retries
        included) before it gives up on them; ``interval_s``: the rest after a failed
        step (a step is woken by each message otherwise)."""
        self.url = url
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.drain_s = drain_s
        self.max_queued = max_queued
        self.delivered = 0
        self.dropped = 0
        self._queue: deque[dict[str, Any]] = deque()  # the head stays until it is handled
        self._changed = threading.Condition()  # guards _queue and the counters; notified as it shrinks
        self._abort = threading.Event()  # stop's drain is over: no more retries
        self._client = httpx.Client(
            timeout=timeout_s, transport=transport, headers={"User-Agent": f"gpufleet/{__version__}"}
        )
        self.loop = Loop(
            name=self.name, step=self.deliver_queued, interval_s=interval_s, on_stop=self._client.close
        )

    @property
    def passes(self) -> int:
        return self.loop.passes

    @property
    def failures(self) -> int:
        return self.loop.failures

    def send(self, message: dict[str, Any]) -> None:
        with self._changed:
            full = len(self._queue) >= self.max_queued
            if full:
                self.dropped += 1
            else:
                self._queue.append(message)
        if full:
            log.warning("alert webhook queue full; dropped a %s message", message.get("status"))
        else:
            self.loop.wake()

    def start(self) -> None:
        self.loop.start()

    def wake(self) -> None:
        self.loop.wake()

    def stop(self) -> None:
        """Let what is queued go out for up to ``drain_s``, then give up its retries (a
        message still failing is dropped) and end the loop."""
        self.loop.wake()
        with self._changed:
            self._changed.wait_for(lambda: not self._queue, timeout=self.drain_s)
        self._abort.set()
        self.loop.stop()

    def deliver_queued(self) -> int:
        """The loop's step: post every queued message, in order; how many were handled."""
        handled = 0
        while True:
            with self._changed:
                if not self._queue:
                    return handled
                message = self._queue[0]
            ok = False
            try:
                ok = self._deliver(message)
            finally:  # delivered, refused, given up on, or raised: it leaves the queue
                with self._changed:
                    self._queue.popleft()
                    if ok:
                        self.delivered += 1
                    else:
                        self.dropped += 1
                    self._changed.notify_all()
            handled += 1

    def _deliver(self, message: dict[str, Any]) -> bool:
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                r = self._client.post(self.url, json=message)
                if r.is_success:
                    return True
                why = f"HTTP {r.status_code}"
                if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                    log.warning("alert webhook refused the message (%s); not retrying", why)
                    return False
            except httpx.HTTPError as exc:
                why = type(exc).__name__
            if attempt == self.attempts:
                log.warning("alert webhook failed %d times (%s); message dropped", attempt, why)
                return False
            log.info("alert webhook attempt %d failed (%s); retrying in %.1fs", attempt, why, delay)
            if self._abort.wait(delay):
                return False
            delay = min(self.max_backoff_s, delay * 2)
        return False


def alert_loop(
    *,
    view: Callable[[], FleetView],
    hot: AgentState,
    sender: WebhookSender,
    rules: AlertRules,
    interval_s: float,
    tracker: AlertTracker | None = None,
) -> Loop:
    """The rules' loop: hands what changed to ``sender``, a loop of its own that the
    caller starts before this one and stops after it."""
    track = tracker or AlertTracker()

    def step() -> int:
        fleet = view()
        messages = track.update(evaluate(fleet, hot, rules=rules), now=fleet.at)
        for m in messages:
            sender.send(m)
        return len(messages)

    return Loop(name="alerts", step=step, interval_s=interval_s)
