"""The fleet page (``GET /``, static files under ``/static``) and the small read
endpoints only it polls: ``/v1/fleet/snapshot``, ``/v1/fleet/services`` and
``/v1/nodes/{name}/history``. For the rest (jobs, usage, teams, prices, reservations)
it calls the same JSON API as any client, signed in with an API token; the page holds
no data of its own."""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from gpufleet import __version__
from gpufleet.api.fleet import FleetSnapshot, NodeHistory
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.routers.agents import HotDep
from gpufleet.server.services import dashboard, fleetservices
from gpufleet.server.services.dashboard import FleetView, ViewCache
from gpufleet.server.services.fleetservices import FleetService

page = APIRouter(include_in_schema=False)
api = APIRouter(tags=["fleet"])
WEB = resources.files("gpufleet.server") / "web"


@cache
def _index() -> str:
    text = (WEB / "templates" / "index.html").read_text(encoding="utf-8")
    return Template(text).safe_substitute(version=__version__)


@page.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return HTMLResponse(_index(), headers={"Cache-Control": "no-cache"})


async def get_views(request: Request) -> ViewCache:
    views: ViewCache = request.app.state.views
    return views


def current_view(parts: PartsDep, views: Annotated[ViewCache, Depends(get_views)]) -> FleetView:
    return views.get(parts.db, now=parts.now(), live_since=parts.live_since())


@api.get("/fleet/snapshot", response_model=FleetSnapshot)
def fleet_snapshot(view: Annotated[FleetView, Depends(current_view)], hot: HotDep, me: Me) -> FleetSnapshot:
    """Every GPU in a few numbers (the page's heatmap)."""
    return dashboard.snapshot(view, hot)


@api.get("/fleet/services", response_model=list[FleetService], tags=["services"])
def fleet_services(
    view: Annotated[FleetView, Depends(current_view)],
    views: Annotated[ViewCache, Depends(get_views)],
    parts: PartsDep,
    hot: HotDep,
    me: Me,
) -> list[FleetService]:
    """The services you may see (``GET /v1/services``' rule) with their replicas and GPUs,
    from the same cached read as the snapshot (the page's Services card and heatmap),
    with their traffic (the gateways' reports) and the last hour of replica counts."""
    now = parts.now()
    return fleetservices.services_for(
        view.services, me, traffic=lambda name: hot.traffic.stats(name, now), history=views.history
    )


@api.get("/nodes/{name}/history", response_model=NodeHistory, tags=["nodes"])
def node_history(name: str, parts: PartsDep, hot: HotDep, me: Me) -> NodeHistory:
    """A node's telemetry, its jobs, and its last failed job attempts with their diagnosis."""
    signatures = parts.config.diagnosis.signatures
    return unwrap(
        dashboard.node_history(
            db=parts.db, hot=hot, actor=me, name=name, now=parts.now(), signatures=signatures
        )
    )
