"""``GET /metrics``: Prometheus exposition, unauthenticated like dcgm-exporter and
node-exporter (scrapers rarely carry tokens; put the server behind a network policy if
GPU telemetry must stay private). No job names or users appear in it."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.server.metrics.state import ServerMetrics

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    state: ServerMetrics = request.app.state.metrics
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
