"""``GET /metrics``: Prometheus exposition, for operators and admins: a bearer token of
one (Prometheus: ``authorization: {credentials_file: ...}`` in the scrape config; see
``prometheus/prometheus.yml``), unless the server runs with ``--metrics-public`` (then
open, like dcgm-exporter and node-exporter; keep it behind a network policy).

Why operators and not any user: the series describe every node, pool, team and
reservation of the fleet (a user sees only their own jobs and their teams' money in the
API), and per-team cost and budgets are finance data. ``--no-team-cost-metrics`` leaves
the per-team cost, GPU-hour, energy and budget series out altogether. No job names or
users appear in it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.server.errors import ProblemError
from gpufleet.server.http.deps import PartsDep, get_principal
from gpufleet.server.metrics.state import ServerMetrics

router = APIRouter(tags=["metrics"])


async def metrics_reader(
    parts: PartsDep, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> None:
    """Lets operators and admins through (anyone with ``--metrics-public``)."""
    if parts.config.metrics_public:
        return
    who = await get_principal(parts, authorization)
    if not who.is_operator:
        raise ProblemError(
            403, "/metrics is for operators and admins (or run the server with --metrics-public)"
        )


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(metrics_reader)])
def metrics(request: Request) -> Response:
    state: ServerMetrics = request.app.state.metrics
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
