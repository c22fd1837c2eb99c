"""The gateway as a raw ASGI app (no framework: every request goes through here, so
routing is two byte-string checks and a dict lookup).

``create_app(source)`` answers ``/s/{service}/{rest}`` by proxying to one of the
service's replicas, plus ``/healthz``, ``/readyz`` and ``/metrics``. The upstream pool
(``upstream.Upstream``) and the feed's poll loop start with the ASGI lifespan,
or on the first request when the server runs without one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.gateway.balancer import Balancer, Feed, Outcome, OutlierPolicy, Pool, Slot
from gpufleet.gateway.errors import error, guess_protocol, reply
from gpufleet.gateway.fanout import ask_all, combine, fanout_kind
from gpufleet.gateway.feed import EndpointSource, load_once, poll
from gpufleet.gateway.metrics import GatewayMetrics, scrape_refused
from gpufleet.gateway.relay import read_body, stream
from gpufleet.gateway.report import Surges, traffic_report
from gpufleet.gateway.upstream import (
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    ReadTimeout,
    Response,
    Upstream,
    UpstreamError,
)
from gpufleet.ratelimit import Buckets, retry_after_header

log = logging.getLogger("gpufleet.gateway")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
# Host and Content-Length are the upstream client's to write; Authorization is the service token,
# which stays here; X-Request-Id is set once, by us; Expect was answered by uvicorn.
DROP_REQUEST = HOP_BY_HOP | {b"host", b"content-length", b"authorization", b"x-request-id", b"expect"}
DROP_RESPONSE = HOP_BY_HOP | {b"x-request-id", b"x-gpufleet-replica"}
REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
SMALL_BODY = 64 * 1024
"""Answers with a Content-Length up to this are read whole and sent in one message."""
DIGESTS_KEPT = 1024
"""Valid bearer tokens whose digests ``Gateway._digest`` keeps."""
UPSTREAM_KEEPALIVE_S = 30.0
"""How long an idle upstream connection stays in the pool. The rule: below the
replica's own keep-alive timeout, so the gateway always retires an idle connection
before the replica closes it and never writes a request onto a connection the replica
is closing (nginx's upstream ``keepalive_timeout`` is 60 s against its server side's
75 s, haproxy's ``timeout http-keep-alive`` likewise sits below the server's). The
model server keeps idle connections 75 s (``gpufleet model-server --keep-alive``);
a replica with a shorter timeout (uvicorn's default is 5 s) still loses no request:
one closed before any answer is resent (``_forward``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig:
    refresh_s: float = 1.0
    max_body_bytes: int = 64 * 1024 * 1024
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 300.0
    """The longest silence from a replica (before or between response chunks)."""
    client_write_timeout_s: float = 60.0
    """The longest a client may leave a streamed chunk unread (its window full): then the
    response is cut and the replica's closed, so a client that stops reading holds
    neither a gateway connection nor a replica's stream for ever."""
    limit_per_host: int = 1024
    upstream_keepalive_s: float = UPSTREAM_KEEPALIVE_S
    max_in_flight_per_replica: int = 256
    """Requests this gateway process has in flight on one replica at most; with every
    replica at it the gateway answers 503 with ``Retry-After: 1`` (0: no cap). Overload
    is the client's to back off from, not a reason to eject a healthy, busy replica."""
    outlier: OutlierPolicy = field(default_factory=OutlierPolicy)
    metrics_tokens: frozenset[str] = frozenset()
    """sha256 hex digests of the bearer tokens ``/metrics`` takes (the gateway's own
    operator token, ``--metrics-token-file``'s); none: ``/metrics`` answers 401."""
    metrics_public: bool = False
    """``/metrics`` without a token (``--metrics-public``)."""


GATEWAY_ID = f"{os.uname().nodename}:{os.getpid()}:{int(time.time())}"
"""This gateway process, as its reports name it."""


TOKEN_MISS_READ_S = 0.25
"""How often, at most, a token no service lists makes the gateway read its feed at once."""

FAST_REFRESH_S = 0.1
"""How often the feed is read after a surge (``Gateway._poll``)."""
FAST_FOR_S = 5.0
"""How long it is read that often."""


class _NotAnswered(Exception):
    """No byte of an answer came back, so the request may be resent (its body is held
    whole): the replica could not be connected to (``closed`` False), or a connection
    was closed before any answer (``closed``: its keep-alive ran out as the request
    went; the same replica on a fresh connection will do)."""

    def __init__(self, reason: str, *, closed: bool, busy: bool = False) -> None:
        super().__init__(reason)
        self.closed = closed
        self.busy = busy


class Gateway:
    """The ASGI app (see the package docstring for what it does and why)."""

    def __init__(
        self, source: EndpointSource, config: GatewayConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.config = config
        self.clock = clock
        self.balancer = Balancer(config.outlier)
        self.metrics = GatewayMetrics()
        self.buckets = Buckets(now=clock)
        self.feed_at: float | None = None
        self._upstream: Upstream | None = None
        """Connections to replicas (``upstream``); a resend goes on a fresh one
        (``fresh=True``), never a pooled one that may be as stale as the one that failed."""
        self._poller: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._digests: dict[bytes, str] = {}
        self._miss_read: asyncio.Future[None] | None = None
        self._miss_read_at = -TOKEN_MISS_READ_S
        self._rid_prefix = os.urandom(6).hex()
        self._rid_count = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._upstream is not None:
            return
        self._upstream = Upstream(
            connect_timeout_s=self.config.connect_timeout_s,
            read_timeout_s=self.config.read_timeout_s,
            keepalive_s=self.config.upstream_keepalive_s,
            limit_per_host=self.config.limit_per_host,
        )
        await load_once(self.source, self._apply, self._feed_failed)
        self._poller = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        if self._upstream is not None:
            await self._upstream.close()
        self._upstream = None
        await self.source.aclose()

    async def _poll(self) -> None:
        """Read the feed every refresh, then report this gateway's counters to the
        source (the server: its services' QPS, latency and in-flight requests). After a
        report that shows a surge (``Surges``), the feed is read every
        ``FAST_REFRESH_S`` for ``FAST_FOR_S``: the server promotes a warm replica on
        that very report, and this gateway should send it requests within a tenth of a
        second, not a refresh later. Reports keep their pace."""
        report = getattr(self.source, "report", None)
        if report is None:
            await poll(self.source, self._apply, self._feed_failed, refresh_s=self.config.refresh_s)
            return
        failing = False
        surges = Surges()
        fast_until = next_report = 0.0
        while True:
            now = self.clock()
            fast = now < fast_until
            wait = min(FAST_REFRESH_S, max(0.0, next_report - now)) if fast else self.config.refresh_s
            await asyncio.sleep(wait)
            await load_once(self.source, self._apply, self._feed_failed)
            now = self.clock()
            if fast and now < next_report:
                continue
            next_report = now + self.config.refresh_s
            doc = self.traffic_report()
            if surges.seen(now, {name: svc["inflight"] for name, svc in doc["services"].items()}):
                fast_until = now + FAST_FOR_S
            try:
                await report(doc)
            except Exception as exc:  # the server blinked: next time; said once, counted always
                self.metrics.report_failures.inc()
                (log.debug if failing else log.warning)("traffic report refused or lost: %s", exc)
                failing = True
            else:
                failing = False

    def traffic_report(self) -> dict[str, Any]:
        """This process's counters per service (``report.traffic_report``)."""
        return traffic_report(self.metrics.registry, GATEWAY_ID)

    def _apply(self, feed: Feed) -> None:
        self.balancer.update(feed)
        self.feed_at = feed.at
        self._digests.clear()  # no revoked token stays in memory
        self.metrics.endpoints.clear()
        for name, svc in feed.services.items():
            self.metrics.endpoints.labels(name).set(len(svc.endpoints))

    def _feed_failed(self, reason: str) -> None:
        self.metrics.feed_failures.inc()
        log.warning("endpoint feed: %s (keeping the last good list)", reason)

    # -- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self._upstream is None:
                await self._start_lazily()
            path: bytes = scope.get("raw_path") or scope["path"].encode()
            if path.startswith(b"/s/"):
                await self._proxy(scope, path, receive, send)
            else:
                await self._local(scope, path, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:  # websocket: not proxied
            await receive()
            await send({"type": "websocket.close", "code": 1003})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start_lazily(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            await self.start()

    async def _local(self, scope: Scope, path: bytes, send: Send) -> None:
        path = path.split(b"?", 1)[0]
        if path == b"/healthz":
            await reply(send, 200, b"application/json", b'{"status":"ok"}')
        elif path == b"/readyz":
            ready = self.feed_at is not None
            body = json.dumps({"ready": ready, "feed_at": self.feed_at, "services": len(self.balancer.pools)})
            await reply(send, 200 if ready else 503, b"application/json", body.encode())
        elif path == b"/metrics":
            refused = scrape_refused(scope["headers"], self.config.metrics_tokens, self.config.metrics_public)
            if refused:
                bearer = [(b"www-authenticate", b"Bearer")]
                return await error(send, "http", 401, "Unauthorized", refused, b"", bearer)
            await reply(send, 200, CONTENT_TYPE_LATEST.encode(), generate_latest(self.metrics.registry))
        else:
            detail = "routes are /s/{service}/..., /healthz, /readyz, /metrics"
            await error(send, "http", 404, "Not Found", detail, b"")

    # -- the proxy ----------------------------------------------------------------------

    async def _read_feed_now(self) -> bool:
        """Read the feed at once for a bearer token no service lists: it may have been made
        a moment ago (``gpufleet service token NAME``, then a request), and the next
        refresh is up to ``--refresh`` away. At most one read every ``TOKEN_MISS_READ_S``
        (strangers trying tokens cost the server at most that); requests that miss
        meanwhile wait for the read in flight. False when no read was made for this one."""
        task = self._miss_read
        if task is None or task.done():
            now = self.clock()
            if now - self._miss_read_at < TOKEN_MISS_READ_S:
                return False
            self._miss_read_at = now
            task = self._miss_read = asyncio.ensure_future(
                load_once(self.source, self._apply, self._feed_failed)
            )
        await asyncio.shield(task)
        return True

    def _new_request_id(self) -> bytes:
        """24 hex digits: 12 random to this process, then a count (unique without a
        ``getrandom`` call per request; a request id is no secret)."""
        self._rid_count += 1
        return b"%s%012x" % (self._rid_prefix.encode(), self._rid_count & 0xFFFFFFFFFFFF)

    def _digest(self, auth: bytes) -> str:
        """The sha256 hex digest of a bearer token ("" for none). Digests of the tokens
        that were valid are kept (at most ``DIGESTS_KEPT``): a service's callers send the
        same few tokens, and hashing is the larger part of checking one. Only tokens the
        feed listed are kept, so a caller trying tokens grows nothing."""
        if auth[:7].lower() != b"bearer ":
            return ""
        token = auth[7:]
        digest = self._digests.get(token)
        if digest is None:
            digest = hashlib.sha256(token).hexdigest()
            if any(digest in pool.service.tokens for pool in self.balancer.pools.values()):
                if len(self._digests) >= DIGESTS_KEPT:
                    self._digests.clear()
                self._digests[token] = digest
        return digest

    async def _proxy(self, scope: Scope, path: bytes, receive: Receive, send: Send) -> None:
        slash = path.find(b"/", 3)
        name = (path[3:] if slash < 0 else path[3:slash]).decode("latin-1")
        rest = b"/" if slash < 0 else path[slash:]
        auth = rid = b""
        length = -1
        forward: list[tuple[bytes, bytes]] = []
        for k, v in scope["headers"]:
            if k in DROP_REQUEST:
                if k == b"authorization":
                    auth = v
                elif k == b"x-request-id":
                    rid = v
                elif k == b"content-length":
                    length = int(v) if v.isdigit() else -1
                elif k == b"transfer-encoding":
                    length = -2  # chunked: read to its end
                continue
            forward.append((k, v))
        if not rid or REQUEST_ID.fullmatch(rid) is None:
            rid = self._new_request_id()
        pool = self.balancer.pools.get(name)
        if pool is None:  # counted apart: a stray name is no service, nor in any report
            self.metrics.unknown.inc()
            detail = f"no service {name[:64]!r} here"
            return await error(send, guess_protocol(rest), 404, "Not Found", detail, rid)
        svc = pool.service
        proto = svc.protocol
        digest = self._digest(auth)
        if digest and digest not in svc.tokens and await self._read_feed_now():
            pool = self.balancer.pools.get(name)  # a token made a moment ago: the feed read again
            if pool is None:
                return await error(send, proto, 404, "Not Found", f"no service {name[:64]!r} here", rid)
            svc, proto = pool.service, pool.service.protocol
            digest = self._digest(auth)
        if digest not in svc.tokens:
            self.metrics.answered(name, 401)
            if digest:
                detail = f"not a service token of {name}: unknown, revoked or another service's"
            else:
                detail = "a service token is required: Authorization: Bearer <token>"
            bearer = [(b"www-authenticate", b"Bearer")]
            return await error(send, proto, 401, "Unauthorized", detail, rid, bearer)
        if svc.rate is not None:
            wait = self.buckets.take((name, digest), svc.rate)
            if wait > 0:
                self.metrics.answered(name, 429)
                retry = [(b"retry-after", retry_after_header(wait).encode())]
                detail = f"rate limit of {svc.rate}"
                return await error(send, proto, 429, "Too Many Requests", detail, rid, retry)
        limit = self.config.max_body_bytes
        if length == -1 or length == 0:  # neither length nor chunked: no body (RFC 9112 6.3)
            body: bytes | None = b""
        else:
            body = None if length > limit else await read_body(receive, limit)
        if body is None:
            self.metrics.answered(name, 413)
            detail = f"request bodies are limited to {limit} bytes"
            return await error(send, proto, 413, "Content Too Large", detail, rid)
        client = scope.get("client")
        if client:
            forward.append((b"X-Forwarded-For", client[0].encode("latin-1")))
        forward.append((b"X-Request-Id", rid))
        qs: bytes = scope.get("query_string", b"")
        target = (rest + b"?" + qs if qs else rest).decode("latin-1")
        latency, gauge = self.metrics.service(name)
        gauge.inc()
        try:
            kind = fanout_kind(scope["method"], rest) if proto == "kserve-v2" else None
            if kind is not None:
                code = await self._fan_out(pool, kind, scope["method"], target, forward, body, rid, send)
            else:
                code = await self._forward(
                    pool, scope["method"], target, forward, body, rid, receive, send, latency
                )
        finally:
            gauge.dec()
        self.metrics.answered(name, code)

    async def _fan_out(
        self,
        pool: Pool,
        kind: str,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        rid: bytes,
        send: Send,
    ) -> int:
        """A request every ready replica must see (``fanout``), answered once."""
        assert self._upstream is not None
        answers = await ask_all(self._upstream, list(pool.slots), method, target, headers, body)
        got = combine(kind, answers)
        extra = [(b"x-request-id", rid), (b"x-gpufleet-replicas", got.replicas.encode())]
        await reply(send, got.status, b"application/json", got.body, extra)
        return got.status

    async def _forward(
        self,
        pool: Pool,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        rid: bytes,
        receive: Receive,
        send: Send,
        latency: Any,
    ) -> int:
        """Send to a replica (once more, on a fresh connection, if no byte of an answer
        came back: to another replica, or to the same when a kept-alive connection was
        found closed), stream its answer back; answers the status the client got."""
        proto = pool.service.protocol
        cap = self.config.max_in_flight_per_replica
        slot = pool.choose(self.clock(), cap=cap)
        if slot is None:
            return await self._unavailable(pool, rid, send)
        t0 = time.perf_counter()
        for attempt in (1, 2):
            try:
                resp = await self._attempt(pool, slot, method, target, headers, body, attempt)
                break
            except _NotAnswered as exc:
                again = None
                if attempt == 1:
                    again = pool.choose(self.clock(), avoid=slot, cap=cap) or (slot if exc.closed else None)
                if again is None and exc.busy:  # it did not accept in time, busy: overload
                    return await self._unavailable(pool, rid, send)
                if again is None:
                    detail = f"replica {slot.endpoint.id}: {exc}"
                    await error(send, proto, 502, "Bad Gateway", detail, rid)
                    return 502
                self.metrics.retries.inc()
                slot = again
            except ReadTimeout:
                self._end(pool, slot, Outcome.HTTP_5XX)
                detail = f"replica {slot.endpoint.id} did not answer"
                await error(send, proto, 504, "Gateway Timeout", detail, rid)
                return 504
            except UpstreamError as exc:
                self._end(pool, slot, Outcome.CONNECTION_FAILED)
                await error(send, proto, 502, "Bad Gateway", f"replica {slot.endpoint.id}: {exc!r}", rid)
                return 502
            except BaseException:
                self._end(pool, slot, Outcome.ABANDONED)
                raise
        latency.observe(time.perf_counter() - t0)
        outcome = Outcome.OK
        if resp.status == 503:
            outcome = Outcome.BUSY  # busy or loading, says the replica: no reason to eject it
        elif resp.status >= 500:
            outcome = Outcome.HTTP_5XX
        try:
            outcome = await self._relay(resp, slot, method, rid, receive, send) or outcome
        finally:
            self._end(pool, slot, outcome)
        return resp.status

    async def _unavailable(self, pool: Pool, rid: bytes, send: Send) -> int:
        """503 with ``Retry-After``: no ready replica, or every one at its cap (overload)."""
        svc = pool.service
        retry = [(b"retry-after", b"1")]
        if not pool.slots:
            detail = f"service {svc.name!r} has no ready replica"
        else:
            self.metrics.overloaded.labels(svc.name).inc()
            detail = (
                f"service {svc.name!r} is overloaded: its {len(pool.slots)} replica(s) are at their"
                f" limit of {self.config.max_in_flight_per_replica} requests in flight or accept no"
                " more connections; retry after 1 s"
            )
        await error(send, svc.protocol, 503, "Service Unavailable", detail, rid, retry)
        return 503

    async def _attempt(
        self,
        pool: Pool,
        slot: Slot,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        attempt: int,
    ) -> Response:
        """The replica's response (headers read); in flight on ``slot`` until ``_end``.
        Raises _NotAnswered when no byte of an answer came, with the slot's verdict
        recorded: refused, or a connect timeout while idle, is a failure; a connect
        timeout while it serves others is a busy replica; a connection closed before any
        answer is an idle connection the replica retired (a failure only the second time)."""
        upstream = self._upstream
        assert upstream is not None
        pool.begin(slot)
        try:
            return await upstream.request(slot.endpoint.url, method, target, headers, body, fresh=attempt > 1)
        except ConnectTimeout as exc:
            busy = slot.in_flight > 1
            self._end(pool, slot, Outcome.BUSY if busy else Outcome.CONNECTION_FAILED)
            raise _NotAnswered(repr(exc), closed=False, busy=busy) from exc
        except ConnectFailed as exc:
            self._end(pool, slot, Outcome.CONNECTION_FAILED)
            raise _NotAnswered(repr(exc), closed=False) from exc
        except Disconnected as exc:
            self._end(pool, slot, Outcome.CLOSED if attempt == 1 else Outcome.CONNECTION_FAILED)
            raise _NotAnswered(repr(exc), closed=True) from exc

    def _end(self, pool: Pool, slot: Slot, outcome: Outcome) -> None:
        if pool.end(slot, outcome, self.clock()):
            self.metrics.ejections.labels(pool.service.name).inc()
            log.warning(
                "ejected replica %s of %s (%s) until +%.0fs",
                slot.endpoint.id,
                pool.service.name,
                outcome.value,
                slot.ejected_until - self.clock(),
            )

    async def _relay(
        self, resp: Response, slot: Slot, method: str, rid: bytes, receive: Receive, send: Send
    ) -> Outcome | None:
        """Stream ``resp`` to the client. None: as the status says; else the outcome
        that overrides it (the replica broke off, or the client left)."""
        headers = [(k, v) for k, v in resp.raw_headers if k.lower() not in DROP_RESPONSE]
        headers.append((b"x-gpufleet-replica", slot.endpoint.id.encode()))
        headers.append((b"x-request-id", rid))
        try:
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            if method == "HEAD" or resp.status in (204, 304):
                await send({"type": "http.response.body", "body": b""})
                return None
            length = resp.content_length
            if length is not None and length <= SMALL_BODY:
                await send({"type": "http.response.body", "body": await resp.read()})
                return None
            return await stream(resp, receive, send, self.config.client_write_timeout_s)
        except UpstreamError as exc:
            log.warning("replica %s broke off a response: %r", slot.endpoint.id, exc)
            return Outcome.CONNECTION_FAILED  # the client's response is left unfinished
        finally:
            resp.release()


def create_app(
    source: EndpointSource,
    *,
    config: GatewayConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Gateway:
    """The gateway ASGI app over ``source``; run it with uvicorn (its lifespan starts
    the upstream pool and the feed's loop), embedded or in its own process."""
    return Gateway(source, config or GatewayConfig(), clock)


__all__ = ["Gateway", "GatewayConfig", "create_app"]
