"""Bodies through the gateway: a request's read whole (a resend must replay it), a
response's streamed chunk by chunk (SSE), with the client's departure and a client that
stops reading both noticed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpufleet.gateway.balancer import Outcome
from gpufleet.gateway.upstream import Response

log = logging.getLogger("gpufleet.gateway")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def stream(resp: Response, receive: Receive, send: Send, write_timeout_s: float) -> Outcome | None:
    """Chunks as they come (SSE, chunked, large bodies). uvicorn's ``send`` ignores a
    client that left, so a watcher on ``receive`` notices it and the replica's
    response is closed (it stops generating); one that stays but stops reading is
    given ``write_timeout_s`` per chunk (uvicorn then closes the unfinished response)."""
    watcher = asyncio.ensure_future(_disconnect(receive))
    try:
        async for chunk in resp.chunks():
            try:
                async with asyncio.timeout(write_timeout_s):  # no task per chunk, unlike wait_for
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except TimeoutError:
                log.warning("a client left a response unread for %.0f s: cut", write_timeout_s)
                resp.close()
                return Outcome.ABANDONED
            if watcher.done():
                resp.close()
                return Outcome.ABANDONED
        await send({"type": "http.response.body", "body": b""})
        return None
    finally:
        watcher.cancel()


async def _disconnect(receive: Receive) -> None:
    """Until the client leaves. A request without a body is answered without reading
    it (``Gateway._proxy``), so its ``http.request`` message may still come first."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body (a retry must be able to resend it); None past ``limit``."""
    msg = await receive()
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body"):
        return body if len(body) <= limit else None
    parts = [body]
    size = len(body)
    while msg.get("more_body"):
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


__all__ = ["read_body", "stream"]
