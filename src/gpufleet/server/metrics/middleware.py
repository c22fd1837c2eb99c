"""API request latency by route *template* (``/v1/jobs/{job_id}``, not one series per
job), method and status. A pure ASGI middleware: no per-request objects beyond a timer."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "<unmatched>"


class LatencyMiddleware:
    def __init__(self, app: ASGIApp, *, histogram: Histogram, skip: tuple[str, ...] = ("/metrics",)) -> None:
        self.app = app
        self.histogram = histogram
        self.skip = skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.skip:
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.histogram.labels(
                route=_template(scope), method=str(scope.get("method", "")), status=str(status[0])
            ).observe(time.perf_counter() - t0)


def _template(scope: Scope) -> str:
    """The matched route's template with its routers' prefixes. Starlette's router puts
    the matched route in the scope; FastAPI (>= 0.16x) puts the route as its own router
    declared it (``/nodes/{name}``, without the ``/v1`` prefix), so the prefix is the part
    of the request path before the suffix the route's regex matches (cached per route)."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if not path:
        return UNMATCHED
    hit = _TEMPLATES.get(id(route))
    if hit is not None and hit[0] is route:
        return hit[1]
    full = str(path)
    regex = getattr(route, "path_regex", None)
    url = str(scope.get("path", ""))
    if regex is not None and not regex.match(url):
        for i, ch in enumerate(url):
            if ch == "/" and i > 0 and regex.match(url[i:]):
                full = url[:i] + full
                break
    if len(_TEMPLATES) < 10_000:
        _TEMPLATES[id(route)] = (route, full)
    return full


_TEMPLATES: dict[int, tuple[Any, str]] = {}
