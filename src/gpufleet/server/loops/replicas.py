"""The replica controller and the autoscaler: every ``interval_s`` (and when woken by a
service change) it steps every autoscaled service's replica count
(``services/autoscaling.py``) and every service's replicas toward its spec
(``services/replicaset.reconcile``); a service's step that created or stopped replicas
wakes the scheduling loop once it has committed (``store/effects.py``), so new ones are
placed at once.

At rest, with no service at all, it looks only every ``idle_s`` (10 s): its work is
time-based only while a service exists (readiness timeouts, crash back-offs, the
autoscaler's windows), and a service's deploy wakes it (``effects.wake_replicas``;
another server's, through NOTIFY)."""

from __future__ import annotations

from sqlalchemy import select

from gpufleet.clock import Clock
from gpufleet.server.runner import Idle, Loop
from gpufleet.server.services.autoscaling import Autoscaler
from gpufleet.server.services.replicaset import reconcile
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import ServiceRow


def replica_loop(
    *,
    db: Database,
    clock: Clock,
    interval_s: float,
    drain_s: float,
    autoscaler: Autoscaler | None = None,
    idle_s: float = 10.0,
) -> Loop:
    idle = Idle(interval_s, idle_s)

    def step() -> int:
        with db.read() as s:
            none = s.scalar(select(ServiceRow.id).limit(1)) is None
        if none:  # nothing to reconcile, nothing time-based: rest until a deploy wakes us
            if autoscaler is not None:
                autoscaler.forget(set())
            idle.until(None)
            return 0
        idle.busy()
        return reconcile(db=db, now=clock.now(), drain_s=drain_s, autoscaler=autoscaler)

    return Loop(name="replicas", step=step, interval_s=interval_s, first_after_s=0.0, rest=idle)
