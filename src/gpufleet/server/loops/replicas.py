"""The replica controller and the autoscaler: every ``interval_s`` (and when woken by a
service change) it steps every autoscaled service's replica count
(``services/autoscaling.py``) and every service's replicas toward its spec
(``services/replicaset.reconcile``); a service's step that created or stopped replicas
wakes the scheduling loop once it has committed (``store/effects.py``), so new ones are
placed at once."""

from __future__ import annotations

from gpufleet.clock import Clock
from gpufleet.server.runner import Loop
from gpufleet.server.services.autoscaling import Autoscaler
from gpufleet.server.services.replicaset import reconcile
from gpufleet.server.store.db import Database


def replica_loop(
    *,
    db: Database,
    clock: Clock,
    interval_s: float,
    drain_s: float,
    autoscaler: Autoscaler | None = None,
) -> Loop:
    def step() -> int:
        return reconcile(db=db, now=clock.now(), drain_s=drain_s, autoscaler=autoscaler)

    return Loop(name="replicas", step=step, interval_s=interval_s, first_after_s=0.0)
