"""The alert loop (``--alert-webhook``): every ``interval_s`` it evaluates the built-in
rules on the fleet view (``alerts.evaluate``), turns what changed into Alertmanager
messages (``AlertTracker``) and hands them to the webhook sender's queue, which posts
them from its own thread and is closed when the loop stops."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.server.agentstate import AgentState
from gpufleet.server.alerts import AlertRules, AlertTracker, WebhookSender, evaluate
from gpufleet.server.loops.runner import Loop
from gpufleet.server.services.dashboard import FleetView


def alert_loop(
    *,
    view: Callable[[], FleetView],
    hot: AgentState,
    sender: WebhookSender,
    rules: AlertRules,
    interval_s: float,
    tracker: AlertTracker | None = None,
) -> Loop:
    track = tracker or AlertTracker()

    def step() -> int:
        fleet = view()
        messages = track.update(evaluate(fleet, hot, rules=rules), now=fleet.at)
        for m in messages:
            sender.send(m)
        return len(messages)

    return Loop(name="alerts", step=step, interval_s=interval_s, on_stop=sender.close)
