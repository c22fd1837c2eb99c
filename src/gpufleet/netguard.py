"""Connection guards for every HTTP server gpufleet runs under uvicorn (the API server,
the gateway, the model server): header, body and idle timeouts, a body-rate floor, a
cap of connections per client address, and headroom on open files.

uvicorn (0.55) times out only an idle keep-alive connection *after* a response: a
connection that sends nothing, a request head that never ends, or a body that stalls
after one byte is held for ever, and with it whatever the application gave the request
(``server/http/lanes.py`` once gave it a seat; issue 29: four such connections stopped every
user's API requests, 1,100 idle ones made every gateway caller get 502). The anchor is
nginx's ``client_header_timeout``, ``client_body_timeout`` and ``limit_conn``, and
Apache's ``mod_reqtimeout`` for the minimum body rate:

=================  ====================================================================
idle               a connection with no byte of a request for ``idle_timeout_s``
                   (a fresh one too, not only after a response) is closed, no answer;
                   once it was answered, ``keepalive_s`` (nginx's ``keepalive_timeout``
                   beside ``client_header_timeout``; default the same)
header             the request head (line and headers) must be complete within
                   ``header_timeout_s`` of its start: 408, closed
body               no byte of the body for ``body_timeout_s``, or less than
                   ``min_body_rate`` bytes a second on average once ``body_grace_s``
                   has passed: 408, closed (the application reading it sees the
                   client go: ``http.disconnect``)
per address        more than ``max_per_address`` connections open at once from one
                   address: the new one is closed at once (counted)
=================  ====================================================================

Decisions:

* One protocol class per server, made by ``guarded(base, limits, stats)``: a subclass of
  uvicorn's protocol in use (``HttpToolsProtocol`` when httptools is installed, else
  ``H11Protocol``; also the server's TLS protocols of ``tlsproto.py``), passed as
  ``uvicorn.Config(http=...)``. It lives outside ``gpufleet.server`` because the gateway
  and the model server (other processes) use it too.
* Time a body is not read because the application has not asked for it (uvicorn pauses
  reading above 64 KiB) is not the client's: the body clocks stop while reading is paused.
* The phases are read from the parser's own state (httptools: its callbacks; h11: its
  ``their_state``). A connection's one timer fires at its phase's deadline, not on a
  fixed tick (issue 35: 50 agents' idle long-polls ticked 100 times a second): waiting
  for a request, at the idle or header deadline; while a body arrives, every ``tick_s``
  (the rate floor); while the application answers, never (a finished response or new
  bytes arm it again). A deadline is kept to within ``tick_s``. The timer is lazy: one
  that fires no later than a new deadline is kept and re-checks when it fires, so a
  request on a kept-alive connection that arrives whole costs no timer operation.
* The address is the peer's (``X-Forwarded-For`` is an application matter: a cap by a
  header anyone may set would be no cap). Behind a proxy every client shares its address:
  raise ``max_per_address`` there (0: no cap).
* ``raise_open_files`` lifts the soft ``RLIMIT_NOFILE`` to the hard limit at start (the
  default soft limit, 1,024, is what 1,100 idle connections exhausted).
* Counts are in ``GuardStats`` (``GuardCollector`` puts them in a Prometheus registry).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RESPONSE_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 16\r\nconnection: close\r\n\r\nrequest timeout\n"
)
REASONS = ("idle", "header", "body", "body_rate")


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardLimits:
    """The limits of every connection (see the module docstring); the defaults are nginx's
    spirit at a tenth of its patience (an API request head or body that takes seconds is
    an attack or a broken client)."""

    idle_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    min_body_rate: float = 1024.0
    """Bytes a second, on average over the body so far, once ``body_grace_s`` has passed."""
    body_grace_s: float = 5.0
    keepalive_s: float | None = None
    """How long a connection that was answered may wait for its next request (None:
    ``idle_timeout_s``). The API server keeps 20 s: its agents renew every 10 s on one
    kept connection instead of a new one each time (issue 35)."""
    max_per_address: int = 256
    """Connections open at once from one address (0: no cap)."""
    tick_s: float = 0.5

    def __post_init__(self) -> None:
        times = (self.idle_timeout_s, self.kept_s, self.header_timeout_s, self.body_timeout_s, self.tick_s)
        if min(times) <= 0 or self.min_body_rate < 0 or self.body_grace_s < 0 or self.max_per_address < 0:
            raise ValueError("connection timeouts must be > 0, the body rate, grace and cap >= 0")

    @property
    def kept_s(self) -> float:
        """``keepalive_s``, or ``idle_timeout_s`` when that is None."""
        return self.idle_timeout_s if self.keepalive_s is None else self.keepalive_s

    def uvicorn_options(self) -> dict[str, Any]:
        """What uvicorn itself takes: its keep-alive timeout after a response."""
        return {"timeout_keep_alive": max(1, round(self.kept_s))}


@dataclass(slots=True)
class GuardStats:
    """Counts of one process's guarded connections (event-loop writes; a scrape reads)."""

    closed: Counter[str] = field(default_factory=Counter)
    """Connections closed by a limit, by reason (``REASONS``)."""
    refused: int = 0
    """Connections closed at once: their address had ``max_per_address`` open."""
    open_by_address: Counter[str] = field(default_factory=Counter)

    @property
    def open(self) -> int:
        return sum(self.open_by_address.values())


class GuardCollector(Collector):
    """``GuardStats`` as Prometheus series, named ``{prefix}_connections_...``."""

    def __init__(self, stats: GuardStats, *, prefix: str) -> None:
        self.stats = stats
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        closed = CounterMetricFamily(
            f"{self.prefix}_connections_timed_out",
            "Connections closed by a timeout (idle, header, body) or the body-rate floor.",
            labels=["reason"],
        )
        for reason in REASONS:
            closed.add_metric([reason], float(self.stats.closed[reason]))
        yield closed
        refused = CounterMetricFamily(
            f"{self.prefix}_connections_refused",
            "Connections closed at once: their client address had the most allowed open.",
        )
        refused.add_metric([], float(self.stats.refused))
        yield refused
        now = GaugeMetricFamily(f"{self.prefix}_connections_open", "HTTP connections open now.")
        now.add_metric([], float(self.stats.open))
        yield now


def raise_open_files() -> tuple[int, int] | None:
    """Lift the soft limit on open files to the hard one (headroom for connections);
    the (soft, hard) limits in force, or None where there is no such limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def guarded(base: type[Any], limits: GuardLimits, stats: GuardStats) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol class ``base`` that keeps ``limits`` and
    counts in ``stats``: pass it as ``uvicorn.Config(http=...)``."""
    attrs = {"guard_limits": limits, "guard_stats": stats}
    return type(f"Guarded{base.__name__}", (_Guard, base), attrs)


def default_protocol() -> type[Any]:
    """uvicorn's choice for ``http="auto"``: httptools when installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools missing
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def uvicorn_options(
    limits: GuardLimits, stats: GuardStats, *, base: type[Any] | None = None
) -> dict[str, Any]:
    """The ``uvicorn.Config``/``uvicorn.run`` keyword arguments of a guarded server (and
    the open-files headroom, raised now)."""
    raise_open_files()
    return {"http": guarded(base or default_protocol(), limits, stats), **limits.uvicorn_options()}


HEAD, BODY, APP = "head", "body", "app"


class _Guard:
    """The mixin ``guarded`` puts before uvicorn's protocol (see the module docstring)."""

    guard_limits: GuardLimits
    guard_stats: GuardStats
    _g_address: str | None = None
    _g_phase: str = HEAD
    _g_since: float = 0.0
    _g_read_at: float = 0.0
    _g_head_bytes: int = 0
    _g_body_bytes: int = 0
    _g_timer: asyncio.TimerHandle | None = None
    _g_due: float = 0.0
    """When ``_g_timer`` fires (``time.monotonic``)."""
    _g_served: bool = False
    """A response was sent: waiting for the next request is keep-alive (``keepalive_s``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "unix"
        cap = self.guard_limits.max_per_address
        if cap and self.guard_stats.open_by_address[address] >= cap:
            self.guard_stats.refused += 1
            transport.close()
            return
        self._g_address = address
        self.guard_stats.open_by_address[address] += 1
        now = time.monotonic()
        self._g_enter(HEAD, now)
        self._g_arm(HEAD, now)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._g_timer is not None:
            self._g_timer.cancel()
            self._g_timer = None
        if self._g_address is not None:
            stats = self.guard_stats.open_by_address
            stats[self._g_address] -= 1
            if stats[self._g_address] <= 0:
                del stats[self._g_address]
            self._g_address = None
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        before = self._g_observe(now)
        first_head = before == HEAD and not self._g_head_bytes
        super().data_received(data)  # type: ignore[misc]
        self._g_read_at = now
        if before == HEAD:
            self._g_head_bytes += len(data)
        after = self._g_observe(now)
        if first_head and after == HEAD:
            self._g_since = now  # the header timeout counts from the head's first byte (nginx's)
        if after == BODY:
            self._g_body_bytes += len(data) if before == BODY else 0
        if after != before or (first_head and after == HEAD):  # the header deadline is sooner
            self._g_arm(after, now)

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """A WebSocket is the application's business once upgraded: no more HTTP clocks."""
        if self._g_timer is not None:
            self._g_timer.cancel()
            self._g_timer = None
        super().handle_websocket_upgrade(*args)  # type: ignore[misc]

    # httptools' callbacks (h11 has none: its state is read in ``_g_phase_now``)
    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        self._g_phase_hint = BODY

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        self._g_phase_hint = APP

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._g_phase_hint == APP:
            self._g_phase_hint = HEAD
        self._g_served = True
        transport: asyncio.Transport | None = getattr(self, "transport", None)
        if self._g_address is not None and transport is not None and not transport.is_closing():
            now = time.monotonic()
            self._g_arm(self._g_observe(now), now)  # waiting for the next request: the idle clock

    _g_phase_hint: str = HEAD

    def _g_phase_now(self) -> str:
        conn = getattr(self, "conn", None)
        if conn is None:
            return self._g_phase_hint
        import h11

        state = conn.their_state
        return HEAD if state is h11.IDLE else BODY if state is h11.SEND_BODY else APP

    def _g_enter(self, phase: str, now: float) -> None:
        self._g_phase, self._g_since, self._g_read_at = phase, now, now
        self._g_head_bytes = self._g_body_bytes = 0

    def _g_observe(self, now: float) -> str:
        phase = self._g_phase_now()
        if phase != self._g_phase:
            self._g_enter(phase, now)
        return phase

    def _g_tick(self) -> None:
        self._g_timer = None
        transport: asyncio.Transport | None = getattr(self, "transport", None)
        if transport is None or transport.is_closing():
            return
        now = time.monotonic()
        phase = self._g_observe(now)
        reason = self._g_overdue(phase, now)
        if reason is not None:
            self._g_expire(reason, transport)
            return
        self._g_arm(phase, now)

    def _g_idle_s(self) -> float:
        return self.guard_limits.kept_s if self._g_served else self.guard_limits.idle_timeout_s

    def _g_arm(self, phase: str, now: float) -> None:
        """The timer for ``phase``'s next check. Lazy: a timer that fires no later than
        the new deadline is kept (when it fires, ``_g_tick`` checks and sets the next
        one), so a kept-alive connection's request and response cost no timer at all;
        only a sooner deadline (a head begun: ``--header-timeout``; a body: its ticks)
        replaces it. While the application answers there is no deadline: a pending
        timer lapses when it fires, and the response's end sets the idle one."""
        lim = self.guard_limits
        if phase == HEAD:
            limit = lim.header_timeout_s if self._g_head_bytes else self._g_idle_s()
            due = max(self._g_since + limit, now) + 0.01  # just past it: overdue is ">"
        elif phase == BODY:
            due = now + lim.tick_s
        else:
            return
        if self._g_timer is not None:
            if self._g_due <= due:
                return
            self._g_timer.cancel()
        self._g_due = due
        self._g_timer = asyncio.get_running_loop().call_later(due - now, self._g_tick)

    def _g_overdue(self, phase: str, now: float) -> str | None:
        lim = self.guard_limits
        if phase == HEAD:
            if not self._g_head_bytes:
                return "idle" if now - self._g_since > self._g_idle_s() else None
            return "header" if now - self._g_since > lim.header_timeout_s else None
        if phase != BODY:
            return None
        flow = getattr(self, "flow", None)
        if flow is not None and flow.read_paused:  # the application is not reading: not the client's time
            self._g_enter(BODY, now)
            return None
        if now - self._g_read_at > lim.body_timeout_s:
            return "body"
        took = now - self._g_since
        if took > lim.body_grace_s and self._g_body_bytes < lim.min_body_rate * took:
            return "body_rate"
        return None

    def _g_expire(self, reason: str, transport: asyncio.Transport) -> None:
        """408 (unless the connection was idle or a response has begun), then close; the
        application reading this request's body sees the client go."""
        self.guard_stats.closed[reason] += 1
        cycle: Any = getattr(self, "cycle", None)  # the last request's: answered if it is complete
        answering = cycle is not None and not getattr(cycle, "response_complete", True)
        started = answering and getattr(cycle, "response_started", False)
        if answering:
            cycle.disconnected = True  # its later sends are dropped; its receive answers disconnect
            cycle.message_event.set()
        if reason != "idle" and not started:
            transport.write(RESPONSE_408)
        transport.close()
