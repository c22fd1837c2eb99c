"""What the server observes as it happens (histograms), for ``/metrics``."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics

from gpufleet.scheduler import Plan, Snapshot

API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# No ``*_created`` series: they double the output and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Histogram(
            "gpufleet_http_request_duration_seconds",
            "API request handling time by route template, method and status.",
            ["route", "method", "status"],
            buckets=API_BUCKETS,
            registry=self.registry,
        )
        self.passes = Histogram(
            "gpufleet_scheduling_pass_duration_seconds",
            "Duration of committed scheduling passes (snapshot, plan, commit; retries included).",
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "gpufleet_queue_wait_seconds",
            "Time from (re)queueing to placement of GPU jobs started by the scheduler, per pool.",
            ["pool"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self.fragmentation: float | None = None
        self.last_pass_at: float | None = None

    def observe_pass(self, snapshot: Snapshot, plan: Plan, seconds: float) -> None:
        """The scheduling loop's ``on_pass``."""
        self.passes.observe(seconds)
        pending = {j.id: j for j in snapshot.pending}
        for st in plan.starts:
            job = pending.get(st.job_id)
            if job is not None:
                self.queue_wait.labels(pool=job.pool).observe(max(0.0, snapshot.now - job.queued_since))
        with self._lock:
            self.fragmentation = plan.fragmentation
            self.last_pass_at = snapshot.now
