"""The model server's access log: one line per request, written when its answer ends.

uvicorn's own access log writes its line when the response *starts*, so it has no
latency, and a stream (SSE) is logged before its first token; this one waits for the
last body message and says how long the request took, as nginx's ``$request_time``::

    127.0.0.1:51234 "POST /v2/models/mlp/infer" 200 2.41ms

(address, method and path without the query string, status, milliseconds from the
request's arrival to its answer's end; ``-`` for a status when the app sent none, as
when the client left first). The logger is ``gpufleet.modelserver.access`` at INFO;
``gpufleet model-server`` turns it on by default (``--no-access-log`` off).
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("gpufleet.modelserver.access")


class AccessLog:
    """Pure ASGI middleware (streams pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = "-"

        async def send_logged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            client = scope.get("client")
            peer = f"{client[0]}:{client[1]}" if client else "-"
            ms = (time.perf_counter() - t0) * 1000.0
            log.info('%s "%s %s" %s %.2fms', peer, scope["method"], scope["path"], status, ms)


__all__ = ["AccessLog"]
