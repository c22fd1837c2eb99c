"""Puts the observability parts into an app: ``/metrics`` (collector, latency middleware,
scheduling-pass observer), the fleet page and its endpoints. ``create_app`` builds the
agents' state with its telemetry history (``store/telemetry.py``) and calls ``install``,
which returns the fleet view that the alert loop (``loops/alerts.py``) evaluates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from gpufleet.server.http.deps import Parts
from gpufleet.server.loops.scheduling import PassObserver
from gpufleet.server.metrics.collector import FleetCollector
from gpufleet.server.metrics.middleware import LatencyMiddleware
from gpufleet.server.metrics.state import ServerMetrics
from gpufleet.server.routers import metrics as metrics_router
from gpufleet.server.routers import web
from gpufleet.server.services.dashboard import FleetView, ViewCache
from gpufleet.server.store.agentstate import AgentState

STATIC = Path(__file__).resolve().parent / "web" / "static"


def install(app: FastAPI, parts: Parts, observer: PassObserver) -> Callable[[], FleetView]:
    hot: AgentState = app.state.hot
    metrics = ServerMetrics()
    views = ViewCache(traffic=hot.traffic, diagnosis=parts.config.diagnosis)
    app.state.metrics = metrics
    app.state.views = views
    observer.on_pass = metrics.observe_pass

    def view() -> FleetView:
        return views.get(parts.db, now=parts.now(), live_since=parts.live_since())

    metrics.registry.register(
        FleetCollector(
            view=view,
            hot=hot,
            metrics=metrics,
            scheduler=parts.scheduler,
            observer=observer,
            team_costs=parts.config.team_cost_metrics,
            bell=app.state.bell,
        )
    )
    app.add_middleware(LatencyMiddleware, histogram=metrics.requests)
    app.include_router(metrics_router.router)
    app.include_router(web.page)
    app.include_router(web.api, prefix="/v1")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return view
