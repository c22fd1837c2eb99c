"""The autoscaler's reads and writes (``autoscale.py`` decides): per autoscaled service,
observe its ready serving replicas and the metric (their GPUs' utilisation from the
agents' telemetry, or the gateways' in-flight requests or QPS), step the HPA rule, and
write the new count (``ServiceRow.scaled_replicas``) with an event that carries the
inputs. A decision that is held back (stabilising, cooling down) is written as an
event when it first happens and then at most once a minute, not every second."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.services import ServiceSpec
from gpufleet.server.decide.autoscale import Observation, ScalePolicy, ScaleState, step
from gpufleet.server.services.inference import IN_ROTATION, add_event, desired_replicas
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.models import Allocation, Job, ServiceRow

ACTOR = "autoscaler"


def policy_of(spec: ServiceSpec) -> ScalePolicy:
    lo = spec.min_replicas if spec.min_replicas is not None else spec.replicas
    hi = spec.max_replicas if spec.max_replicas is not None else spec.replicas
    return ScalePolicy(
        min_replicas=lo,
        max_replicas=hi,
        metric=spec.metric,
        target=spec.scale_target,
        scale_up_stabilization_s=spec.scale_up_stabilization,
        scale_down_cooldown_s=spec.scale_down_cooldown,
    )


@dataclass(slots=True)
class Autoscaler:
    hot: AgentState
    """The agents' telemetry and the gateways' traffic, read at each step."""
    max_age_s: float = 30.0
    window_s: float = 15.0
    """QPS is averaged over this window."""
    inflight_window_s: float = 5.0
    """In-flight requests are averaged over this shorter one: smooth enough that one
    burst does not scale, short enough that a step in load does at once."""
    panic_window_s: float = 2.0
    """The demand the panic rule reads (``autoscale.py``): in flight at the gateways over
    about two of their reports."""
    states: dict[int, ScaleState] = field(default_factory=dict)
    held_every_s: float = 60.0
    _held: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Per service: the last held decision written (up or down) and when."""

    def observe(self, s: Session, row: ServiceRow, spec: ServiceSpec, now: float) -> Observation:
        current = desired_replicas(row, spec)
        ready = list(
            s.scalars(
                select(Job.id).where(
                    Job.service_id == row.id,
                    *IN_ROTATION,
                )
            )
        )
        value, inflight = self.gateway_readings(row.name, spec.metric, len(ready), now)
        if ready and spec.metric == "gpu_util":
            per_job: dict[int, list[tuple[str, int]]] = {}
            q = select(Allocation.job_id, Allocation.node, Allocation.gpu_index).where(
                Allocation.job_id.in_(ready)
            )
            for jid, node, idx in s.execute(q):
                if idx is not None:  # a 0-GPU replica has no utilisation
                    per_job.setdefault(jid, []).append((node, idx))
            telemetry = self.hot.telemetry
            utils = [telemetry.mean_util(g, now=now, max_age_s=self.max_age_s) for g in per_job.values()]
            seen = [u for u in utils if u is not None]
            value = sum(seen) / len(seen) if seen else None
        return Observation(current=current, ready=len(ready), value=value, inflight=inflight)

    def gateway_readings(
        self, name: str, metric: str, ready: int, now: float
    ) -> tuple[float | None, float | None]:
        """(the ``inflight`` or ``qps`` metric per ready replica, None for ``gpu_util`` or
        without a report; the demand in flight at the gateways over the panic window, the
        panic rule's input whatever the metric). Two readings of one store over two
        windows: the panic one short (a step shows within two reports), the metric's
        longer (one burst does not scale)."""
        demand = self.hot.traffic.stats(name, now, self.panic_window_s)
        inflight = None if demand is None else demand.inflight_avg
        if not ready or metric == "gpu_util":
            return None, inflight
        by_inflight = metric == "inflight"
        traffic = self.hot.traffic.stats(name, now, self.inflight_window_s if by_inflight else self.window_s)
        if traffic is None:
            return None, inflight
        return (traffic.inflight_avg if by_inflight else traffic.qps) / ready, inflight

    def step(self, s: Session, row: ServiceRow, spec: ServiceSpec, now: float) -> bool:
        """One decision for one service, in the caller's transaction; True if it scaled."""
        obs = self.observe(s, row, spec, now)
        state = self.states.setdefault(row.id, ScaleState())
        decision = step(policy_of(spec), state, obs, now)
        if decision.desired != obs.current:
            row.scaled_replicas = decision.desired
            add_event(s, row.id, at=now, actor=ACTOR, kind="scale", reason=decision.reason)
            self._held.pop(row.id, None)
            return True
        if decision.kind in ("held-up", "held-down"):
            kind = decision.kind
            last = self._held.get(row.id)
            if last is None or last[0] != kind or now - last[1] >= self.held_every_s:
                add_event(s, row.id, at=now, actor=ACTOR, kind="scale-held", reason=decision.reason)
                self._held[row.id] = (kind, now)
        return False

    def forget(self, service_ids: set[int]) -> None:
        for sid in [k for k in self.states if k not in service_ids]:
            del self.states[sid]
            self._held.pop(sid, None)
