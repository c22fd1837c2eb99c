"""Puts the observability parts into an app: telemetry history, ``/metrics`` (collector,
latency middleware, scheduling-pass observer), the fleet page and its endpoints, and the
built-in alert loop when ``--alert-webhook`` is set. ``create_app`` calls ``install``
and starts/stops what it returns with its lifespan."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from gpufleet.server.alerts import AlertLoop, AlertRules, WebhookSender
from gpufleet.server.deps import Parts
from gpufleet.server.hot import HotState
from gpufleet.server.metrics.collector import FleetCollector
from gpufleet.server.metrics.history import RecordingTelemetryStore
from gpufleet.server.metrics.middleware import LatencyMiddleware
from gpufleet.server.metrics.state import ServerMetrics
from gpufleet.server.routers import metrics as metrics_router
from gpufleet.server.routers import web
from gpufleet.server.services.dashboard import FleetView, ViewCache

STATIC = Path(__file__).resolve().parents[1] / "web" / "static"


class Observability:
    def __init__(self, *, alerts: AlertLoop | None) -> None:
        self.alerts = alerts

    def start(self) -> None:
        if self.alerts is not None:
            self.alerts.start()

    def stop(self) -> None:
        if self.alerts is not None:
            self.alerts.stop()


def install(app: FastAPI, parts: Parts) -> Observability:
    hot: HotState = app.state.hot
    if not isinstance(hot.telemetry, RecordingTelemetryStore):
        hot.telemetry = RecordingTelemetryStore()
    metrics = ServerMetrics()
    views = ViewCache()
    app.state.metrics = metrics
    app.state.views = views
    parts.scheduler.on_pass = metrics.observe_pass

    def view() -> FleetView:
        return views.get(parts.db, now=parts.now(), live_since=parts.live_since())

    metrics.registry.register(
        FleetCollector(
            view=view,
            hot=hot,
            metrics=metrics,
            scheduler=parts.scheduler,
            team_costs=parts.config.team_cost_metrics,
        )
    )
    app.add_middleware(LatencyMiddleware, histogram=metrics.requests)
    app.include_router(metrics_router.router)
    app.include_router(web.page)
    app.include_router(web.api, prefix="/v1")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    cfg = parts.config
    loop = None
    if cfg.alert_webhook:
        loop = AlertLoop(
            view=view,
            hot=hot,
            sender=WebhookSender(cfg.alert_webhook),
            rules=AlertRules(queue_wait_s=cfg.queue_wait_alert_s),
            interval_s=cfg.alert_interval_s,
        )
    return Observability(alerts=loop)
