"""Admission: every API request (``/v1/...`` but the health probes, and ``/metrics``) is
put in a lane, charged to its user's bucket, and admitted through its lane's seats,
before any handler runs. The fleet page's static files are not API requests.

The anchor is Kubernetes' API Priority and Fairness (APF): requests are classified into
priority levels, each with its own concurrency share and bounded queues, so one level
saturated never queues another; a request that does not fit answers 429. Lanes here,
highest first:

======  ==========================================================================
node    agents: ``POST /v1/nodes/{name}/sync`` (and anything else) with a node
        credential (``gfn_``) or a node certificate, and a sync (a renewal, a long-poll)
        made with an operator's or admin's token (an agent run with one). An
        agent's long-poll (``GET /v1/nodes/{name}/wait``, ``dispatch.py``) takes no
        seat: it waits for seconds on a future, holding nothing a sync needs
admin   operators and admins
user    everyone else, and requests whose credential is missing or unknown (the app
        answers them 401)
======  ==========================================================================

"Controllers" (the scheduling, lifecycle, accrual and alert loops) are not in a
lane: they do not come through HTTP. They run in their own threads (and the scheduler
in its own process), and the lanes keep user requests from taking what they need: the
thread pool (the seats of all lanes fit in it; ``_fit_thread_pool``) and the
interpreter (the user lane has few seats, and ``SWITCH_INTERVAL_S``).

Decisions where APF is silent or does not fit:

* Lanes are fixed (three), not configurable objects; their seats are options.
* A request holds its seats until its response starts (not until its body is sent: a
  followed log stream must not hold a seat for hours).
* A list page is wider than one seat, one per 100 items it asks for (APF's width of a
  LIST), but never more than half its lane, so one large page cannot shut the lane.
* Within a lane, fair queuing by user (APF's flows, without its shuffle sharding: a
  queue per user, served round robin; ``Lane``), on top of the per-user buckets
  (``ratelimit.py``), which are charged before a request queues, so a flooding user's
  excess is refused at the door, cheaply, and what it may send waits its turn instead
  of in front of everyone.
* 429, not 503, when a lane's queue is full or a request waited ``wait_s``: APF's
  answer, and the one clients already back off on (``Retry-After: 1``).
* Refusals are paced: every 429 here is sent one second after the request came (the
  shortest ``Retry-After`` there is), as nginx's ``limit_req`` delays excess requests
  instead of answering at once. A client that honours ``Retry-After`` loses nothing; one
  that ignores it (a loop, a flood) gets one answer a second per connection instead of
  thousands, and those thousands of 429s no longer take the interpreter from the lanes
  (``bench/bench_flood.py``: 16 connections got ~3,000 answers a second unpaced).

The caller is resolved once here (token cache; on a miss one database lookup, in a
small limiter of its own, so unknown tokens cannot take the pool's threads), and
``deps.get_principal`` then finds it in the cache. Failed authentications are counted
from the responses (any 401) per source address (``ratelimit.AuthThrottle``).

Verify first, throttle failures only (issue 29): a credential is checked before the
throttle is asked, so a valid one is never refused because its address is failing (a
shared NAT, an agent next to a flood). Once an address is throttled, a token the cache
does not hold is first looked up in memory (``ratelimit.KnownDigests``: the digests of
every live token and node credential, re-read at most every few seconds) and only one
found there costs a database look-up; the rest are refused (429, paced) without one.

The order of a request: its ticket (who, which lane; rate limits), then its body,
read in full (up to ``max_body_bytes``, 413 above) with no seat held, then its seats. A
body that stalls is the connection's business (``gpufleet.netguard`` closes it: 408), so
it never holds a seat; a request with no valid credential queues in the user lane as a
flow of its address, behind nobody's turn but its own.
"""

from __future__ import annotations

import asyncio
import enum
import math
import re
import sys
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.ratelimit import (
    AuthThrottle,
    Buckets,
    KnownDigests,
    LaneSizes,
    RateLimits,
    retry_after_header,
)
from gpufleet.server.problems import body_too_large, problem_response
from gpufleet.server.services import steps
from gpufleet.server.services.auth import (
    Principal,
    TokenCache,
    authenticate,
    hash_token,
    hasher_for,
    live_digests,
)

if TYPE_CHECKING:
    from gpufleet.server.store.agentstate import CredCache
    from gpufleet.server.store.db import Database

NODE_TOKEN_PREFIX = "gfn_"
SYNC_PATH = re.compile(r"/v1/nodes/[^/]+/(?:sync|renew)")
WAIT_PATH = re.compile(r"/v1/nodes/[^/]+/wait")
UNLIMITED = ("/v1/healthz", "/v1/readyz")
"""Probes: answered without a token or a database look-up, outside any lane."""
LIST_PATHS = frozenset(
    (
        "/v1/jobs",
        "/v1/reservations",
        "/v1/users",
        "/v1/teams",
        "/v1/tokens",
        "/v1/nodes",
        "/v1/pools",
        "/v1/fleet/events",
        "/v1/node-credentials",
    )
)
MINTS = frozenset(("/v1/users", "/v1/tokens", "/v1/sessions", "/v1/nodes/join-tokens"))
"""A 201 here made a credential: ``KnownDigests`` re-reads before its next refusal."""
ITEMS_PER_SEAT = 100
AUTH_LOOKUPS = 4
"""Database look-ups of unknown tokens at once (their own limiter)."""
SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread switch interval (Python's default: 5 ms). A sync releases the
GIL at every database call and waits up to one interval to get it back from a thread
that is building a large page; at 5 ms that convoy made a sync's p99 ~120 ms next to a
continuous flood of 1,000-job pages, at 1 ms ~35 ms (same machine, interleaved runs)."""
HOLD_S = 1.0
"""A refusal (429) is sent this long after the request came: see the module docstring."""


class LaneName(enum.StrEnum):
    NODE = "node"
    ADMIN = "admin"
    USER = "user"


class Lane:
    """Seats with a bounded queue, fair between flows (users); event-loop only (no
    locks). Each flow's requests wait in their own FIFO; when seats free up, the flows
    are served in turn (round robin: the flow served goes to the back), so a request of
    a quiet user waits for at most one request of each busy user, not for the whole
    queue they filled. A head that needs more seats than are free waits, and nobody
    passes it (a wide request is never starved by narrow ones)."""

    def __init__(self, name: LaneName, *, seats: int, queue: int, wait_s: float) -> None:
        self.name = name
        self.seats = seats
        self.free = seats
        self.queue = queue
        self.wait_s = wait_s
        self._flows: dict[object, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._turns: deque[object] = deque()
        """Flows with requests waiting, the next to be served first."""
        self._count = 0

    @property
    def queued(self) -> int:
        return self._count

    async def enter(self, width: int, flow: object = None) -> bool:
        """Take ``width`` seats (``width()`` sizes a request) for ``flow`` (who asks;
        None: one shared flow), at once or in its flow's turn; False when the queue is
        full or the wait ran out (nothing taken)."""
        if not self._count and self.free >= width:
            self.free -= width
            return True
        if self._count >= self.queue:
            return False
        item = (width, asyncio.get_running_loop().create_future())
        waiting = self._flows.get(flow)
        if waiting is None:
            waiting = self._flows[flow] = deque()
            self._turns.append(flow)
        waiting.append(item)
        self._count += 1
        try:
            async with asyncio.timeout(self.wait_s):
                await item[1]
        except TimeoutError:
            self._abandon(flow, item)
            return False
        except asyncio.CancelledError:  # the client went away while it waited
            self._abandon(flow, item)
            raise
        return True

    def _abandon(self, flow: object, item: tuple[int, asyncio.Future[None]]) -> None:
        width, fut = item
        if fut.done() and not fut.cancelled():
            self.leave(width)  # the seats came just as the wait ended: hand them on
            return
        fut.cancel()
        waiting = self._flows.get(flow)
        if waiting is not None and item in waiting:
            waiting.remove(item)
            self._count -= 1
            if not waiting:
                del self._flows[flow]
                self._turns.remove(flow)
        self._wake()  # a wide request at the head may have held narrower ones back

    def leave(self, width: int) -> None:
        self.free += width
        self._wake()

    def _wake(self) -> None:
        while self._turns:
            flow = self._turns[0]
            waiting = self._flows[flow]
            width, fut = waiting[0]
            if width > self.free:
                return
            waiting.popleft()
            self._count -= 1
            self._turns.popleft()
            if waiting:
                self._turns.append(flow)  # its next request waits for the others' turns
            else:
                del self._flows[flow]
            if not fut.done():
                self.free -= width
                fut.set_result(None)

    def width(self, asked: int) -> int:
        return max(1, min(asked, self.seats // 2 or 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """What admission decided for one request."""

    lane: LaneName
    width: int = 1
    flow: object = None
    """Whose turn it is in the lane's fair queue: the user (None: one shared flow)."""


class Admission:
    """The ASGI middleware (outside the body limit and the submit route: a refused request
    costs neither a body read nor a route)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        db: Database,
        tokens: TokenCache,
        creds: CredCache,
        rates: RateLimits,
        sizes: LaneSizes,
        max_body_bytes: int,
        buckets: Buckets | None = None,
        throttle: AuthThrottle | None = None,
    ) -> None:
        self.app = app
        self.db = db
        self.tokens = tokens
        self.creds = creds
        self.rates = rates
        self.sizes = sizes
        self.buckets = buckets or Buckets()
        self.throttle = throttle or AuthThrottle(rates.auth_failures)
        self.max_body_bytes = max_body_bytes
        self.known = KnownDigests(load=partial(live_digests, db))
        seats = {LaneName.NODE: sizes.node, LaneName.ADMIN: sizes.admin, LaneName.USER: sizes.user}
        self.lanes = {
            name: Lane(name, seats=n, queue=sizes.queue_per_seat * n, wait_s=sizes.wait_s)
            for name, n in seats.items()
        }
        self._lookups: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path.startswith("/v1/") or path == "/metrics") or path in UNLIMITED:
            await self.app(scope, receive, send)
            return
        if self._lookups is None:
            self._lookups = anyio.CapacityLimiter(AUTH_LOOKUPS)
            _fit_thread_pool(self.sizes)
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        address = str((scope.get("client") or ("unknown",))[0])
        ticket = await self._ticket(scope, address)
        if isinstance(ticket, Refusal):
            await ticket.send(scope, receive, send)
            return
        arrived = await self._body(scope, receive)
        if arrived is None:
            return  # the client went (or the connection guard closed it) before its body arrived
        if arrived is Arrival.TOO_LARGE:
            await body_too_large(self.max_body_bytes, path)(scope, receive, send)
            return
        receive = arrived
        if ticket.lane is LaneName.NODE and WAIT_PATH.fullmatch(path):
            await self.app(scope, receive, send)  # an agent's long-poll: no seat (``dispatch.py``)
            return
        lane = self.lanes[ticket.lane]
        width = lane.width(ticket.width)
        if not await lane.enter(width, ticket.flow):
            detail = f"the server is busy ({lane.name} lane full: {lane.seats} seats, {lane.queued} waiting)"
            await Refusal(detail=detail, wait_s=1.0).send(scope, receive, send)
            return
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                lane.leave(width)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] == 401:
                    self.throttle.failed(address)
                elif message["status"] == 201 and path in MINTS:
                    self.known.invalidate()
                release()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            release()

    async def _ticket(self, scope: Scope, address: str) -> Ticket | Refusal:
        if _client_certificate(scope):
            return Ticket(lane=LaneName.NODE)  # TLS verified it against the cluster CA
        token = _bearer(scope)
        digest = hash_token(token) if token else None
        if token and token.startswith(NODE_TOKEN_PREFIX):
            known = digest is not None and self.creds.get(digest) is not None
            if not known and (wait := await self._unknown_wait(token, address)):
                return wait
            return Ticket(lane=LaneName.NODE)  # the route checks it (a 401 is counted)
        who = self.tokens.get(digest) if digest is not None else None
        if who is None and token:
            if wait := await self._unknown_wait(token, address):
                return wait
            assert self._lookups is not None
            who = await anyio.to_thread.run_sync(
                partial(authenticate, db=self.db, token=token, cache=self.tokens), limiter=self._lookups
            )
        if who is None:
            if not token and (wait := self._auth_wait(address)):
                return wait  # no credential at all: nothing valid to refuse
            # the app answers 401 (and it is counted); its own flow: it waits behind no user
            return Ticket(lane=LaneName.USER, flow=("address", address))
        if who.is_operator and _agent_call(scope):
            return Ticket(lane=LaneName.NODE)
        width = _width(scope)
        refused = self._charge(scope, who, width)
        if refused is not None:
            return refused
        lane = LaneName.ADMIN if who.is_operator else LaneName.USER
        return Ticket(lane=lane, width=width, flow=who.user_id)

    def _charge(self, scope: Scope, who: Principal, cost: int) -> Refusal | None:
        rate = self.rates.for_role(who.role)
        if rate is None:
            return None
        wait = self.buckets.take(who.user_id, rate, cost)
        if wait <= 0:
            return None
        what = "request" if cost == 1 else f"request (a page of up to {cost * ITEMS_PER_SEAT} costs {cost})"
        detail = (
            f"rate limit: {who.name} ({who.role}) may make {rate.burst:g} requests at once and "
            f"{rate.per_s:g} a second; retry this {what} in {retry_after_header(wait)} s"
        )
        return Refusal(detail=detail, wait_s=wait)

    async def _unknown_wait(self, token: str, address: str) -> Refusal | None:
        """None: look the token up (its address is not throttled, or the token is among
        the live credentials); else the refusal, decided without the database."""
        if self.throttle.retry_after(address) <= 0:
            return None
        hasher = hasher_for(self.db, self.tokens.hasher)
        if steps.signed_job_credential(token, hasher):
            return None  # a job's own credential: checked by its signature, not stored
        digests = (hasher.digest(token), hasher.legacy(token))
        if self.known.holds(digests):
            return None
        if self.known.stale():
            assert self._lookups is not None
            await anyio.to_thread.run_sync(self.known.reload, limiter=self._lookups)
            if self.known.holds(digests):
                return None
        return self._auth_wait(address)

    async def _body(self, scope: Scope, receive: Receive) -> Receive | Arrival | None:
        """The request's body, read in full before any seat is taken: a receive that
        replays it; TOO_LARGE above ``max_body_bytes``; None when the client went first."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                return Arrival.TOO_LARGE
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return Arrival.TOO_LARGE
            chunks.append(chunk)
            if not message.get("more_body", False):
                return _replay(b"".join(chunks), receive)

    def _auth_wait(self, address: str) -> Refusal | None:
        wait = self.throttle.retry_after(address)
        if wait <= 0:
            return None
        detail = f"too many failed authentications from {address}; retry in {retry_after_header(wait)} s"
        return Refusal(detail=detail, wait_s=wait)


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A 429: problem+json with ``Retry-After``, sent ``HOLD_S`` after the request came."""

    detail: str
    wait_s: float

    async def send(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(HOLD_S)
        headers = {"Retry-After": retry_after_header(self.wait_s)}
        title = "Too Many Requests"
        answer = problem_response(Request(scope), 429, self.detail, title=title, headers=headers)
        await answer(scope, receive, send)


class Arrival(enum.Enum):
    TOO_LARGE = "too large"
    """``Admission._body``: the body is larger than the server takes (413)."""


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read by admission, then the connection's own (a
    disconnect, for a handler that waits for one)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def _agent_call(scope: Scope) -> bool:
    """A sync or a long-poll (what an agent run with an operator's token sends)."""
    if scope["method"] == "POST":
        return SYNC_PATH.fullmatch(scope["path"]) is not None
    return scope["method"] == "GET" and WAIT_PATH.fullmatch(scope["path"]) is not None


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def _client_certificate(scope: Scope) -> bool:
    """A client certificate the TLS layer verified (the ASGI TLS extension, which
    ``gpufleet server --tls-cert ... --ca-dir`` fills)."""
    tls = scope.get("extensions", {}).get("tls") or {}
    return bool(tls.get("client_cert_chain"))


def _width(scope: Scope) -> int:
    """Seats (and bucket tokens) a request takes: 1, or one per 100 items a list page
    asks for (its ``limit``; 100 when not given)."""
    if scope["method"] != "GET" or scope["path"] not in LIST_PATHS:
        return 1
    raw = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("limit", ["100"])[-1]
    try:
        limit = int(raw)
    except ValueError:
        return 1  # the route answers 422
    return max(1, math.ceil(min(limit, 100_000) / ITEMS_PER_SEAT))


def _fit_thread_pool(sizes: LaneSizes) -> None:
    """Synchronous handlers run in anyio's default thread pool (FastAPI's
    ``run_in_threadpool``): make it hold every lane's seats at once, plus the token
    look-ups and a margin (followed log streams poll in it outside any lane), so a
    full user lane never leaves a sync waiting for a thread."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    need = sizes.node + sizes.admin + sizes.user + AUTH_LOOKUPS + 8
    if limiter.total_tokens < need:
        limiter.total_tokens = need
