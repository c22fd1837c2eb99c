"""How many replicas a service should serve with: a pure function of its policy, what
was observed, and its own recent history (Kubernetes' HorizontalPodAutoscaler rule).

- **Recommendation**: ``ceil(ready x observed / target)``, where ``observed`` is the
  metric averaged over the ready replicas: ``gpu_util`` (% of their GPUs, default target
  70), ``inflight`` (requests in flight per replica, from the gateways) or ``qps``
  (requests per second per replica). Inside the tolerance (``|observed/target - 1| <=
  0.1``) the recommendation is the current count. No data (no ready replica, no
  reading): no change. Always clamped to ``min..max``.
- **Scale up** at once to the recommendation; then, for ``scale_up_stabilization_s``
  (30 s), not again while replicas of that scale-up are not ready yet: they must take
  their share before the metric means anything again. Once every wished replica is
  ready (a warm one is at once), a reading that still asks for more scales again. (HPA's
  scale-up window would instead delay the first step by the window: a 5x step in load
  must be served in seconds, which a warm pool makes possible.)
- **Scale down** only when every recommendation of the last ``scale_down_cooldown_s``
  (5 min) was lower (the highest of them is taken: HPA's scale-down stabilisation
  window) and no scale happened in that time: a noisy load never flaps.
- **Panic** (Knative's KPA): utilisation saturates at 100 %, so one HPA step can add at
  most 100/target (x1.43 at 70 %) and a 5x step takes several slow rounds. The demand
  the gateways see is not capped: requests in flight there (queued at the replicas
  included) over a short window (``Observation.inflight``). A ready replica at the
  target holds ``capacity`` of them: the metric's own target for ``inflight``, else
  learned while the load is calm (in flight per ready replica, scaled to the target,
  smoothed; ``ScaleState.per_replica``). When that demand is worth at least
  ``panic_threshold`` (2) times the ready replicas (unrounded, as Knative compares it),
  the count goes to that demand (rounded up) in
  one step, past the scale-up stabilisation; for ``panic_hold_s`` (60 s, Knative's
  stable window) after, or the service's own ``scale_down_cooldown_s`` if shorter,
  nothing scales down (a service that asks to scale down after 4 s of calm is not held
  for a minute because a step once panicked it).

Every decision carries its inputs as a sentence, written as the service's event, and
says what it is as a value (``Decision.kind``): no caller parses the sentence.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Metric = Literal["gpu_util", "inflight", "qps"]
DEFAULT_TARGETS: dict[str, float] = {"gpu_util": 70.0, "inflight": 4.0, "qps": 50.0}
UNITS: dict[str, str] = {"gpu_util": "% GPU", "inflight": " in flight", "qps": " req/s"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalePolicy:
    min_replicas: int
    max_replicas: int
    metric: Metric = "gpu_util"
    target: float = 70.0
    tolerance: float = 0.1
    scale_up_stabilization_s: float = 30.0
    scale_down_cooldown_s: float = 300.0
    panic_threshold: float = 2.0
    panic_hold_s: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    current: int
    """The replica count the service is at now (its desired serving count)."""
    ready: int
    value: float | None
    """The metric per ready replica (None: no reading)."""
    inflight: float | None = None
    """Requests in flight at the gateways for the service, over the panic window (None:
    no gateway reported it)."""


@dataclass(slots=True)
class ScaleState:
    """What the autoscaler remembers of one service between steps (in memory: after a
    restart it starts over, which can only delay a scale-down)."""

    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    last_up_at: float | None = None
    last_change_at: float | None = None
    first_at: float | None = None
    """The first step: a scale-down needs a whole cooldown of history."""
    per_replica: float | None = None
    """Requests in flight per ready replica at the target, learned while calm."""
    panic_until: float | None = None


Kind = Literal["up", "down", "panic", "bounds", "held-up", "held-down", "steady"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    desired: int
    reason: str
    kind: Kind = "steady"

    def changed(self, current: int) -> bool:
        return self.desired != current


def recommend(policy: ScalePolicy, obs: Observation) -> int:
    current = obs.current
    if obs.value is None or obs.ready == 0:
        rec = current
    else:
        ratio = obs.value / policy.target if policy.target > 0 else 1.0
        rec = current if abs(ratio - 1.0) <= policy.tolerance else math.ceil(obs.ready * ratio - 1e-9)
    return max(policy.min_replicas, min(policy.max_replicas, rec))


LEARN_LOW, LEARN_HIGH = 0.2, 1.1
"""The metric's band (as a share of its target) in which in-flight requests per replica
are learned: loaded enough to mean something, not yet saturated."""
LEARN_WEIGHT = 0.2


def capacity(policy: ScalePolicy, state: ScaleState) -> float | None:
    """Requests in flight a ready replica holds at the target (None: not known yet)."""
    if policy.metric == "inflight":
        return policy.target if policy.target > 0 else None
    return state.per_replica


def learn(policy: ScalePolicy, state: ScaleState, obs: Observation) -> None:
    if policy.metric == "inflight" or obs.value is None or obs.inflight is None or obs.ready == 0:
        return
    if policy.target <= 0 or not LEARN_LOW <= obs.value / policy.target <= LEARN_HIGH or obs.inflight <= 0:
        return
    at_target = obs.inflight / obs.ready * policy.target / obs.value
    old = state.per_replica
    state.per_replica = at_target if old is None else old + LEARN_WEIGHT * (at_target - old)


def panic_need(policy: ScalePolicy, state: ScaleState, obs: Observation) -> int | None:
    """The replicas the gateways' demand needs, when that is a panic (at least
    ``panic_threshold`` times the ready ones); else None."""
    k = capacity(policy, state)
    if k is None or k <= 0 or obs.inflight is None or obs.ready == 0:
        return None
    wanted = obs.inflight / k
    # the unrounded ratio, as Knative compares it: rounded up first, 1.3 replicas' worth of
    # demand on one ready replica read as 2 = twice the ready ones, a panic at a calm load
    return math.ceil(wanted - 1e-9) if wanted >= policy.panic_threshold * obs.ready else None


def step(policy: ScalePolicy, state: ScaleState, obs: Observation, now: float) -> Decision:
    """One decision; updates ``state``."""
    current = obs.current
    rec = recommend(policy, obs)
    recs = state.recommendations
    recs.append((now, rec))
    if state.first_at is None:
        state.first_at = now
    horizon = now - max(policy.scale_down_cooldown_s, policy.scale_up_stabilization_s)
    while recs and recs[0][0] < horizon:
        recs.popleft()
    unit = UNITS[policy.metric]
    seen = "no reading" if obs.value is None else f"{obs.value:.1f}{unit} per replica"
    inputs = f"{seen} over {obs.ready} ready, target {policy.target:g}{unit}"
    bounded = max(policy.min_replicas, min(policy.max_replicas, current))
    if bounded != current:  # the bounds changed under it
        span = f"{policy.min_replicas}..{policy.max_replicas}"
        return _changed(state, now, bounded, current, f"{current} -> {bounded}: outside {span}", "bounds")
    need = panic_need(policy, state, obs)
    learn(policy, state, obs)
    if need is not None:
        target = min(policy.max_replicas, max(need, rec))
        state.panic_until = now + min(policy.panic_hold_s, policy.scale_down_cooldown_s)
        if target > current:
            state.last_up_at = now
            k = capacity(policy, state) or 0.0
            why = (
                f"panic: scale up {current} -> {target}: {obs.inflight:.1f} in flight at the gateways, "
                f"{k:.2f} per replica at the target ({inputs})"
            )
            return _changed(state, now, target, current, why, "panic")
    if rec > current:
        settling = obs.ready < current
        if (
            settling
            and state.last_up_at is not None
            and now - state.last_up_at < policy.scale_up_stabilization_s
        ):
            wait = policy.scale_up_stabilization_s - (now - state.last_up_at)
            return Decision(
                desired=current,
                reason=f"would scale up to {rec} ({inputs}); stabilising {wait:.0f}s",
                kind="held-up",
            )
        state.last_up_at = now
        return _changed(state, now, rec, current, f"scale up {current} -> {rec}: {inputs}", "up")
    if rec < current:
        window = [r for t, r in recs if t >= now - policy.scale_down_cooldown_s]
        since = now - (state.last_change_at if state.last_change_at is not None else state.first_at)
        if since < policy.scale_down_cooldown_s:
            why = f"would scale down to {rec} ({inputs}); cooling down"
            return Decision(desired=current, reason=why, kind="held-down")
        if state.panic_until is not None and now < state.panic_until:
            why = f"would scale down to {rec} ({inputs}); panic mode for {state.panic_until - now:.0f}s more"
            return Decision(desired=current, reason=why, kind="held-down")
        highest = max(window)
        if highest < current:
            why = f"scale down {current} -> {highest}: {inputs}, lower for {policy.scale_down_cooldown_s:g}s"
            return _changed(state, now, highest, current, why, "down")
        return Decision(
            desired=current,
            reason=f"would scale down to {rec} ({inputs}); load was higher lately",
            kind="held-down",
        )
    return Decision(desired=current, reason=f"steady: {inputs}")


def _changed(state: ScaleState, now: float, desired: int, current: int, reason: str, kind: Kind) -> Decision:
    state.last_change_at = now
    return Decision(desired=desired, reason=reason, kind=kind)
