"""Leadership series (``leader.py``): whether this server leads, the epoch, the lease's age.

``gpufleet_leader`` is 1 on the server whose loops run (a single SQLite server: always 1),
so ``sum(gpufleet_leader) < 1`` over the servers Prometheus scrapes is "no leader" (the
``GpufleetNoLeader`` rule). Epoch and lease age come from the lease row, read at scrape
time; a database that does not answer leaves them out (the other series still come).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gpufleet.server.store.leader import Leadership, read_state


class LeaderCollector(Collector):
    def __init__(self, *, server: str, leadership: Leadership | None, engine: Engine | None) -> None:
        self.server = server
        self.leadership = leadership
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        lead = GaugeMetricFamily(
            "gpufleet_leader",
            "1 if this server runs the loops (holds the leader's lease), else 0.",
            labels=["server"],
        )
        lead.add_metric([self.server], 1.0 if self.leadership is None or self.leadership.leading else 0.0)
        yield lead
        if self.leadership is None or self.engine is None:
            return
        changes = CounterMetricFamily(
            "gpufleet_leader_terms", "Terms this server has led (leadership gained).", labels=["server"]
        )
        changes.add_metric([self.server], float(self.leadership.changes))
        yield changes
        try:
            state = read_state(self.engine)
        except SQLAlchemyError:
            return
        if state is None:
            return
        epoch = GaugeMetricFamily("gpufleet_leader_epoch", "The leader's lease epoch (the fencing token).")
        epoch.add_metric([], float(state.epoch))
        yield epoch
        age = GaugeMetricFamily(
            "gpufleet_leader_lease_age_seconds", "Seconds since the leader last renewed its lease."
        )
        age.add_metric([], max(0.0, state.renewed_s_ago))
        yield age
