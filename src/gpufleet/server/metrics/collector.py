"""The scrape-time collector: per-GPU series under the DCGM exporter's names and labels
(so dashboards built for ``dcgm-exporter`` work unchanged) and the ``gpufleet_*`` fleet,
queue and scheduler series.

DCGM names, units and meaning (``dcgm-exporter``'s default counters):

==================================  =========================================
``DCGM_FI_DEV_GPU_UTIL``            utilisation, %
``DCGM_FI_DEV_FB_USED`` / ``_FREE`` framebuffer memory used / free, MiB
``DCGM_FI_DEV_GPU_TEMP``            temperature, C
``DCGM_FI_DEV_POWER_USAGE``         power draw, W
``DCGM_FI_DEV_XID_ERRORS``          the last XID the GPU reported (0: none)
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``   volatile double-bit ECC errors
==================================  =========================================

Labels: ``gpu`` (index), ``UUID``, ``device`` (``nvidiaN``), ``modelName``, ``Hostname``
(the node name). A GPU without telemetry yet has no DCGM series.

MIG instances (``FleetView.gpus``' ``mig_devices``, as the node's inventory reports them),
with the GPU's labels and, as dcgm-exporter labels a MIG device, ``GPU_I_ID`` and
``GPU_I_PROFILE`` (and ``mig_uuid``):

=============================================  =============================================
``gpufleet_mig_instance``                      1 per instance
``gpufleet_mig_instance_allocated``            1 while a job holds it, else 0
``gpufleet_mig_instance_memory_used_bytes``    its memory in use (its agent's telemetry; an
                                               older agent sends none: no series)
``gpufleet_mig_instance_memory_total_bytes``   its memory (the same telemetry)
``gpufleet_mig_instance_power_watts``          an estimate: the GPU's power x compute slices
                                               / 7 (NVML measures no power per instance; the
                                               ledger charges a slice's energy by this rule)
=============================================  =============================================

No utilisation per instance: NVML has none (dcgm-exporter reads DCGM's profiling
counters, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``; gpufleet does not).

GPU shares, per GPU an operator marked shared, with the GPU's DCGM labels:
``gpufleet_gpu_shared`` (1) and ``gpufleet_gpu_share_allocated_ratio`` (share units its
jobs hold / ``migindex.SHARE_UNITS``: 0.75 when jobs hold 75 % of it).

Usage and cost (``FleetView.spend``: the ledger, refreshed every ``ViewCache.spend_ttl_s``)
are this calendar month's, in the finance time zone (the price schedule's; UTC without
one), so they fall back to 0 when a month begins; every team has them:

================================================  ====================================
``gpufleet_team_cost_accrued{team}``              cost accrued (price schedule's unit)
``gpufleet_team_gpu_hours{team}``                 GPU-hours held by the team's jobs
``gpufleet_team_energy_kwh{team}``                energy its GPUs drew, kWh
``gpufleet_team_budget{team,kind}``               monthly budget, ``kind`` soft | hard
                                                  (only the kinds a team has)
================================================  ====================================

Reservation utilisation (``FleetView.reservations``), one series each per BOOKED
reservation whose window is open now (maintenance windows aside), labels
``reservation`` (id), ``name``, ``team`` ("" without one) and ``pool``:
``gpufleet_reservation_gpus`` (reserved) and ``gpufleet_reservation_used_gpus`` (of
those, held by its owner jobs; ``ReservationUse``). Utilisation is their ratio.

Inference services (``FleetView.services`` and the gateways' reports,
``AgentState.traffic``), labels ``service`` and ``team``. The traffic series exist once
a gateway reports the service; the request counters and buckets are the sums of the
live gateways' cumulative counters (a gateway silent for ``TrafficStore.forget_s`` drops
out of the sum: Prometheus sees a counter reset, which ``rate`` handles):

==================================================  ===========================================
``gpufleet_service_requests_total{code}``           answers by HTTP status code
``gpufleet_service_request_seconds``                histogram of answer times (``_bucket{le}``,
                                                    ``_count``; no ``_sum``: the reports carry
                                                    none per bucket set)
``gpufleet_service_inflight``                       requests in flight at the gateways
``gpufleet_service_replicas{state}``                ``desired`` (the controller's target),
                                                    ``ready`` (in rotation), ``warm`` (standby)
``gpufleet_service_replicas_max``                   the autoscaler's ceiling (autoscaled only)
``gpufleet_service_slo_p99_seconds``                the spec's p99 objective (when set)
``gpufleet_service_gpu_utilization``                mean % over its serving replicas' GPUs
                                                    (those with telemetry)
``gpufleet_service_power_watts``                    power of all its replicas' GPUs, W
``gpufleet_service_energy_wh_per_1k``               Wh per 1,000 answers: power / QPS
                                                    (QPS over 30 s; only while QPS > 0)
``gpufleet_service_cost_per_1k``                    cost per 1,000 answers: its GPUs' price
                                                    per hour now (priority and warm factors
                                                    as the ledger's) / (QPS x 3600) x 1000;
                                                    only while QPS > 0 and prices are set;
                                                    left out with ``team_costs`` False
==================================================  ===========================================

Racks (``services/racks.py``, label ``rack``): ``gpufleet_rack_power_watts``, its estimated
draw as the scheduler counts it (every rack); ``gpufleet_rack_power_budget_watts`` and
``gpufleet_rack_power_cap_watts``, its feed and the feed less headroom (racks with a budget).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpufleet.migindex import SHARE_UNITS, slice_model, slice_share_of
from gpufleet.server.decide.pricing import PriceSchedule
from gpufleet.server.loops.scheduling import PassObserver
from gpufleet.server.metrics.state import ServerMetrics
from gpufleet.server.runner import Runner
from gpufleet.server.services.dashboard import FleetView
from gpufleet.server.services.fleetservices import ServiceInfo
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.dispatch import NodeBell
from gpufleet.server.store.telemetry import RecordingTelemetryStore

DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]
MIB = 1024 * 1024
DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors."),
)


class FleetCollector(Collector):
    def __init__(
        self,
        *,
        view: Callable[[], FleetView],
        hot: AgentState,
        metrics: ServerMetrics,
        scheduler: Runner,
        observer: PassObserver | None = None,
        team_costs: bool = True,
        bell: NodeBell | None = None,
    ) -> None:
        """``team_costs``: False leaves out the ``gpufleet_team_cost_accrued``,
        ``_gpu_hours``, ``_energy_kwh`` and ``_budget`` series (``--no-team-cost-metrics``)."""
        self.view = view
        self.hot = hot
        self.metrics = metrics
        self.scheduler = scheduler
        self.observer = observer or PassObserver()
        self.team_costs = team_costs
        self.bell = bell

    def collect(self) -> Iterator[Metric]:
        view = self.view()
        yield from self._dcgm(view)
        yield from self._fleet(view)
        yield from self._queue(view)
        if self.team_costs:
            yield from self._cost(view)
        yield from self._reservations(view)
        yield from self._racks(view)
        yield from self._services(view)
        yield from self._scheduler()

    def _dcgm(self, view: FleetView) -> Iterator[Metric]:
        fams = {name: GaugeMetricFamily(name, doc, labels=DCGM_LABELS) for name, doc in DCGM}
        store = self.hot.telemetry
        xids = store if isinstance(store, RecordingTelemetryStore) else None
        for g in view.gpus:
            tel = store.get(g.node)
            t = tel.gpus.get(g.index) if tel is not None else None
            if t is None or t.lost:
                continue
            labels = [str(g.index), g.uuid, f"nvidia{g.index}", g.model, g.node]

            def put(name: str, value: float | None, labels: list[str] = labels) -> None:
                if value is not None:
                    fams[name].add_metric(labels, value)

            put("DCGM_FI_DEV_GPU_UTIL", t.utilization_pct)
            put("DCGM_FI_DEV_FB_USED", t.memory_used_mb)
            put("DCGM_FI_DEV_FB_FREE", None if t.memory_used_mb is None else g.memory_mb - t.memory_used_mb)
            put("DCGM_FI_DEV_GPU_TEMP", t.temperature_c)
            put("DCGM_FI_DEV_POWER_USAGE", t.power_w)
            last = xids.last_xid(g.node, g.index) if xids is not None else None
            put("DCGM_FI_DEV_XID_ERRORS", last.code if last else (t.xid_events[-1] if t.xid_events else 0))
            put("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", t.ecc_dbe)
        yield from fams.values()
        yield from self._mig(view)
        yield from self._shares(view)

    def _mig(self, view: FleetView) -> Iterator[Metric]:
        """One series per MIG instance, labelled as dcgm-exporter labels MIG devices
        (``GPU_I_ID``, ``GPU_I_PROFILE`` beside the GPU's own labels); the readings join
        the agent's telemetry to the inventory by GPU instance id."""
        labels = [*DCGM_LABELS, "GPU_I_ID", "GPU_I_PROFILE", "mig_uuid"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        info = gauge("gpufleet_mig_instance", "1 per MIG instance of a GPU.")
        held = gauge("gpufleet_mig_instance_allocated", "1 if a job holds the MIG instance, else 0.")
        used = gauge("gpufleet_mig_instance_memory_used_bytes", "Memory in use on the MIG instance (bytes).")
        total = gauge("gpufleet_mig_instance_memory_total_bytes", "Memory of the MIG instance (bytes).")
        power = gauge(
            "gpufleet_mig_instance_power_watts",
            "Estimated power of the MIG instance (W): its GPU's power draw x its compute slices / 7, "
            "as the ledger charges its energy (NVML measures no power per instance).",
        )
        store = self.hot.telemetry
        for g in view.gpus:
            if not g.mig_devices:
                continue
            tel = store.get(g.node)
            t = tel.gpus.get(g.index) if tel is not None else None
            t = None if t is None or t.lost else t
            mem = {m.gpu_instance_id: m for m in t.mig_instances} if t is not None else {}
            for uuid, profile, gi, index in g.mig_devices:
                lv = [str(g.index), g.uuid, f"nvidia{g.index}", g.model, g.node, str(gi), profile, uuid]
                info.add_metric(lv, 1.0)
                held.add_metric(lv, 1.0 if (g.node, index) in view.held_slices else 0.0)
                m = mem.get(gi)
                if m is not None and m.memory_used_mb is not None:
                    used.add_metric(lv, m.memory_used_mb * MIB)
                if m is not None and m.memory_total_mb is not None:
                    total.add_metric(lv, m.memory_total_mb * MIB)
                if t is not None and t.power_w is not None:
                    power.add_metric(lv, t.power_w * slice_share_of(slice_model(g.model, profile)))
        yield from (info, held, used, total, power)

    def _shares(self, view: FleetView) -> Iterator[Metric]:
        """Per shared GPU: that it is shared, and how much of it its jobs hold."""
        shared = GaugeMetricFamily(
            "gpufleet_gpu_shared",
            "1 per GPU an operator marked shared (it takes GPU shares, never a whole-GPU job).",
            labels=DCGM_LABELS,
        )
        ratio = GaugeMetricFamily(
            "gpufleet_gpu_share_allocated_ratio",
            f"Share of a shared GPU its jobs hold: their units / {SHARE_UNITS} (a unit is 1 % of its "
            "compute and memory).",
            labels=DCGM_LABELS,
        )
        for g in view.gpus:
            if g.shared:
                lv = [str(g.index), g.uuid, f"nvidia{g.index}", g.model, g.node]
                shared.add_metric(lv, 1.0)
                ratio.add_metric(lv, view.held_units.get((g.node, g.index), 0) / SHARE_UNITS)
        yield from (shared, ratio)

    def _fleet(self, view: FleetView) -> Iterator[Metric]:
        nodes = {n.name: n for n in view.nodes}
        ready = GaugeMetricFamily(
            "gpufleet_node_ready", "1 if the node is Ready, else 0.", labels=["node", "pool"]
        )
        cordoned = GaugeMetricFamily(
            "gpufleet_node_cordoned", "1 if the node is cordoned.", labels=["node", "pool"]
        )
        for n in view.nodes:
            ready.add_metric([n.name, n.pool], 1.0 if n.ready else 0.0)
            cordoned.add_metric([n.name, n.pool], 1.0 if n.cordoned else 0.0)
        kinds = ("total", "allocated", "free", "cordoned", "unhealthy")
        counts: dict[str, dict[str, int]] = {}
        for g in view.gpus:
            node = nodes.get(g.node)
            if node is None:
                continue
            c = counts.setdefault(node.pool, dict.fromkeys(kinds, 0))
            c["total"] += 1
            busy = (g.node, g.index) in view.held
            c["allocated"] += busy
            c["unhealthy"] += not g.healthy
            out = node.cordoned or g.cordoned
            c["cordoned"] += out
            c["free"] += not busy and g.healthy and not out and node.ready
        gpus = {
            k: GaugeMetricFamily(
                f"gpufleet_gpus_{k}" if k != "total" else "gpufleet_gpus",
                _GPU_DOCS[k],
                labels=["pool"],
            )
            for k in kinds
        }
        for pool, c in sorted(counts.items()):
            for k in kinds:
                gpus[k].add_metric([pool], c[k])
        team = GaugeMetricFamily(
            "gpufleet_team_gpus_allocated",
            "GPUs held by the team's scheduled and running jobs.",
            labels=["team"],
        )
        for t, held in sorted(view.team_gpus.items()):
            team.add_metric([t], held)
        yield from (ready, cordoned, *gpus.values(), team)

    def _queue(self, view: FleetView) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("gpufleet_jobs", "Jobs by state.", labels=["state"])
        for state, n in view.jobs.items():
            jobs.add_metric([state], n)
        pending = GaugeMetricFamily("gpufleet_jobs_pending", "Pending jobs per pool.", labels=["pool"])
        oldest = GaugeMetricFamily(
            "gpufleet_queue_oldest_wait_seconds",
            "How long the longest-waiting pending job of the pool has waited.",
            labels=["pool"],
        )
        for q in view.queues:
            pending.add_metric([q.pool], q.pending)
            if q.oldest_since is not None:
                oldest.add_metric([q.pool], max(0.0, view.at - q.oldest_since))
        yield from (jobs, pending, oldest)

    def _cost(self, view: FleetView) -> Iterator[Metric]:
        cost = GaugeMetricFamily(
            "gpufleet_team_cost_accrued",
            "Cost accrued by the team's jobs this calendar month (finance time zone).",
            labels=["team"],
        )
        hours = GaugeMetricFamily(
            "gpufleet_team_gpu_hours",
            "GPU-hours held by the team's jobs this calendar month.",
            labels=["team"],
        )
        energy = GaugeMetricFamily(
            "gpufleet_team_energy_kwh",
            "Energy drawn by the team's GPUs this calendar month (kWh).",
            labels=["team"],
        )
        budget = GaugeMetricFamily(
            "gpufleet_team_budget",
            "The team's monthly budget: soft warns, hard holds new jobs.",
            labels=["team", "kind"],
        )
        for t in view.spend:
            cost.add_metric([t.team], t.cost)
            hours.add_metric([t.team], t.gpu_hours)
            energy.add_metric([t.team], t.energy_kwh)
            for kind, value in (("soft", t.budget_soft), ("hard", t.budget_hard)):
                if value is not None:
                    budget.add_metric([t.team, kind], value)
        yield from (cost, hours, energy, budget)

    def _reservations(self, view: FleetView) -> Iterator[Metric]:
        labels = ["reservation", "name", "team", "pool"]
        gpus = GaugeMetricFamily(
            "gpufleet_reservation_gpus", "GPUs reserved by an open reservation.", labels=labels
        )
        used = GaugeMetricFamily(
            "gpufleet_reservation_used_gpus",
            "Of an open reservation's GPUs, those its owner jobs hold.",
            labels=labels,
        )
        for r in view.reservations:
            key = [str(r.id), r.name, r.team, r.pool]
            gpus.add_metric(key, r.gpus)
            used.add_metric(key, r.used)
        yield from (gpus, used)

    def _racks(self, view: FleetView) -> Iterator[Metric]:
        draw = GaugeMetricFamily(
            "gpufleet_rack_power_watts",
            "A rack's estimated draw, W, as the scheduler counts it (scheduler/powermodel.py).",
            labels=["rack"],
        )
        budget = GaugeMetricFamily(
            "gpufleet_rack_power_budget_watts",
            "A rack's declared power feed, W (racks with a budget).",
            labels=["rack"],
        )
        cap = GaugeMetricFamily(
            "gpufleet_rack_power_cap_watts",
            "A rack's feed less its headroom: what new work may fill, W.",
            labels=["rack"],
        )
        for r in view.racks:
            draw.add_metric([r.rack], r.draw_kw * 1000)
            if r.power_kw is not None and r.cap_kw is not None:
                budget.add_metric([r.rack], r.power_kw * 1000)
                cap.add_metric([r.rack], r.cap_kw * 1000)
        yield from (draw, budget, cap)

    def _services(self, view: FleetView) -> Iterator[Metric]:
        labels = ["service", "team"]

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*labels, *extra])

        requests = CounterMetricFamily(
            "gpufleet_service_requests",
            "Answers by HTTP status code, summed over the gateways.",
            labels=[*labels, "code"],
        )
        latency = HistogramMetricFamily(
            "gpufleet_service_request_seconds", "Answer times at the gateways.", labels=labels
        )
        inflight = gauge("gpufleet_service_inflight", "Requests in flight at the gateways.")
        replicas = gauge(
            "gpufleet_service_replicas",
            "Replicas: desired (the controller's target), ready (in rotation), warm (standby).",
            ("state",),
        )
        ceiling = gauge("gpufleet_service_replicas_max", "The autoscaler's most replicas.")
        slo = gauge("gpufleet_service_slo_p99_seconds", "The service's p99 latency objective.")
        util = gauge("gpufleet_service_gpu_utilization", "Mean utilisation of its serving replicas' GPUs, %.")
        power = gauge("gpufleet_service_power_watts", "Power drawn by all its replicas' GPUs, W.")
        energy = gauge(
            "gpufleet_service_energy_wh_per_1k", "Energy per 1,000 answers at the current QPS, Wh."
        )
        cost = gauge(
            "gpufleet_service_cost_per_1k",
            "Cost of 1,000 answers at the current QPS and its GPUs' price now (price schedule's unit).",
        )
        traffic = self.hot.traffic
        totals = traffic.totals(view.at)
        models = {(g.node, g.index): g.model for g in view.gpus}
        for x in view.services:
            key = [x.name, x.team]
            for state, n in (("desired", x.desired), ("ready", x.ready), ("warm", x.warm)):
                replicas.add_metric([*key, state], n)
            if x.max_replicas is not None:
                ceiling.add_metric(key, x.max_replicas)
            if x.slo_p99_ms is not None:
                slo.add_metric(key, x.slo_p99_ms / 1000)
            watts, busy = self._gpu_load(x)
            if watts is not None:
                power.add_metric(key, watts)
            if busy:
                util.add_metric(key, sum(busy) / len(busy))
            total = totals.get(x.name)
            if total is not None:
                codes, le, buckets, n = total
                for code, count in sorted(codes.items()):
                    requests.add_metric([*key, code], count)
                inflight.add_metric(key, n)
                if le:
                    cumulative = _buckets(le, buckets)
                    latency.add_metric(key, buckets=cumulative, sum_value=None)
                    # prometheus_client writes _count only beside a _sum; the +Inf bucket is it
                    counted = Sample(
                        f"{latency.name}_count", dict(zip(labels, key, strict=True)), cumulative[-1][1]
                    )
                    latency.samples.append(counted)
            stats = traffic.stats(x.name, view.at)
            qps = stats.qps if stats is not None else 0.0
            if qps <= 0:
                continue
            if watts is not None:
                energy.add_metric(key, watts / qps * 1000 / 3600)
            if view.prices is not None and self.team_costs:
                per_hour = _price_per_hour(x, view.prices, models, view.at)
                cost.add_metric(key, per_hour / (qps * 3600) * 1000)
        yield from (requests, latency, inflight, replicas, ceiling, slo, util, power, energy)
        if self.team_costs:
            yield cost

    def _gpu_load(self, x: ServiceInfo) -> tuple[float | None, list[float]]:
        """(power of all its replicas' GPUs, None without any reading; utilisation of
        each of its serving replicas' GPUs with a reading)."""
        watts: float | None = None
        busy: list[float] = []
        for r in x.replicas:
            for node, index in r.gpus:
                tel = self.hot.telemetry.get(node)
                t = tel.gpus.get(index) if tel is not None else None
                if t is None or t.lost:
                    continue
                if t.power_w is not None:
                    watts = (watts or 0.0) + t.power_w
                if r.serving and t.utilization_pct is not None:
                    busy.append(t.utilization_pct)
        return watts, busy

    def _scheduler(self) -> Iterator[Metric]:
        m = self.metrics
        if m.fragmentation is not None:
            yield GaugeMetricFamily(
                "gpufleet_fragmentation_ratio",
                "Share of free GPUs too scattered for the head waiting job (last scheduling pass).",
                value=m.fragmentation,
            )
        yield CounterMetricFamily(
            "gpufleet_scheduling_passes", "Committed scheduling passes.", value=self.scheduler.passes
        )
        yield CounterMetricFamily(
            "gpufleet_scheduling_failures", "Scheduling passes that failed.", value=self.scheduler.failures
        )
        yield GaugeMetricFamily(
            "gpufleet_scheduler_skipped_nodes",
            "Nodes the last scheduling pass left out: their stored GPUs are invalid (several models...).",
            value=self.observer.skipped_nodes,
        )
        stats = self.hot.latencies.stats()
        yield CounterMetricFamily("gpufleet_syncs", "Agent syncs handled.", value=stats.count)
        sync = GaugeMetricFamily(
            "gpufleet_sync_latency_seconds",
            "Agent sync handling time over the last minute, by quantile.",
            labels=["quantile"],
        )
        for q, ms in (("0.5", stats.p50_ms), ("0.99", stats.p99_ms), ("1", stats.max_ms)):
            if ms is not None:
                sync.add_metric([q], ms / 1000)
        yield sync
        rejected = CounterMetricFamily(
            "gpufleet_sync_rejected_items",
            "Job states (kind=state) and log chunks (kind=log) in agent syncs that were dropped: "
            "the node may not speak for that job attempt (reason).",
            labels=["kind", "reason"],
        )
        for (kind, reason), n in sorted(self.hot.rejected.counts().items()):
            rejected.add_metric([kind, reason], n)
        yield rejected
        yield CounterMetricFamily(
            "gpufleet_node_renewals",
            "Idle nodes' lease renewals taken instead of full syncs (memory only, no database write).",
            value=self.hot.renewals,
        )
        skipped = CounterMetricFamily(
            "gpufleet_gateway_report_rejected_items",
            "Entries of gateways' traffic reports skipped (the rest taken): reason=name (not a "
            "service's name), counters (malformed).",
            labels=["reason"],
        )
        for reason, n in self.hot.traffic.rejected().items():
            skipped.add_metric([reason], n)
        yield skipped
        if self.bell is not None:
            yield GaugeMetricFamily(
                "gpufleet_agents_waiting",
                "Agents' long-polls open now (push dispatch: each is told the moment its node has work).",
                value=self.bell.waiting,
            )
            yield CounterMetricFamily(
                "gpufleet_dispatch_rings",
                "Node wake-ups sent after commits that placed or stopped work on a node.",
                value=self.bell.rings,
            )


def _buckets(le: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Cumulative buckets with a ``+Inf`` last (a gateway sends 1e9 for it: JSON has no
    infinity; without one, the last bound's count stands for it)."""
    out = [
        ("+Inf" if bound >= 1e9 else str(float(bound)), float(n)) for bound, n in zip(le, counts, strict=True)
    ]
    if not out or out[-1][0] != "+Inf":
        out.append(("+Inf", out[-1][1] if out else 0.0))
    return out


def _price_per_hour(
    x: ServiceInfo, prices: PriceSchedule, models: dict[tuple[str, int], str], now: float
) -> float:
    """What its replicas' GPUs cost per hour now, as the ledger prices them (a warm
    replica at the schedule's ``warm`` factor)."""
    total = 0.0
    for r in x.replicas:
        factor = prices.warm if r.warm else 1.0
        for gpu in r.gpus:
            total += prices.price(models.get(gpu, ""), now, priority=r.priority) * factor
    return total


_GPU_DOCS = {
    "total": "Registered GPUs per pool.",
    "allocated": "GPUs held by scheduled or running jobs.",
    "free": "Healthy, unallocated GPUs on Ready, uncordoned nodes.",
    "cordoned": "GPUs cordoned, alone or with their node.",
    "unhealthy": "GPUs marked unhealthy.",
}
