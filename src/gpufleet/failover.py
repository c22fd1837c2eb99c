"""Several servers, one cluster: in what order a client tries them, and when it moves on.

Every gpufleet server on one database answers every API call, so the three clients of
the API (the CLI's ``client.py``, the agent's ``agent/transport.py``, the gateway's
``gateway/feed.py``) take a list of server URLs (``http://a:8080,http://b:8080``) and
share this rule:

* **Order** (``Servers.order``): the server that answered last first (sticky: its
  keep-alive connection is warm, and an agent's syncs and long-poll stay together), then
  the others as given. A server that failed in the last ``cool_down_s`` goes after all
  of those: still tried, as a last resort, but not first; after the cool-down it is an
  equal again. Nothing is ever given up for good.
* **Move on** (``Walk.failed``) after a failure where the request never reached a
  server (``Failure.sent`` false: connection refused, connect timeout, TLS handshake
  failure, a name that does not resolve), whatever the request.
* After a failure where it may have reached one and been acted on (``sent``: the
  connection was reset or timed out after the request went out, or a proxy in front
  answered 502/503/504), only a *repeatable* request moves on: RFC 9110's idempotent
  methods (GET, HEAD, OPTIONS, PUT, DELETE), or a request its caller declares so (the
  agent's sync, idempotent by design: ``server/services/sync.py``). Any other request,
  ``POST /v1/jobs`` first of all, stops there with an error naming the servers tried:
  a job submitted twice is worse than an error.
* Any other answer, 4xx and 500 included, is the answer: a server that answers is up.

No I/O here: a caller sends, says what happened (``failure_of`` for httpx's errors,
``proxy_failure`` for a status in ``PROXY_DOWN``) and reports it to its ``Walk``. The
module imports only the standard library (the CLI pays for every import); ``failure_of``
imports httpx when it is called, by which time the caller has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

R = TypeVar("R")

REPEATABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
"""RFC 9110's idempotent methods: sending one twice leaves what sending it once does."""
PROXY_DOWN = frozenset({502, 503, 504})
"""Statuses a proxy or load balancer answers for a server behind it that is down,
restarting or silent (gpufleet's API itself answers none of them)."""
COOL_DOWN_S = 5.0
"""How long a server that failed goes to the back of the order."""
CONNECT_TIMEOUT_S = 5.0
"""A client with several servers waits this long (at most) for a connection, so that a
silent server (powered off, partitioned) costs seconds before the next is tried, not
the whole request timeout. With one server there is nothing to move on to: it waits
as long as it always did."""


def parse_urls(given: str | Sequence[str]) -> tuple[str, ...]:
    """Server URLs from a comma-separated list (or a sequence of such lists): each
    without its trailing ``/``, duplicates dropped, order kept. ValueError when there is
    none, or one is not ``http://`` or ``https://``."""
    parts = [given] if isinstance(given, str) else list(given)
    urls: list[str] = []
    for part in parts:
        for raw in part.replace(",", " ").split():
            url = raw.rstrip("/")
            if not url.startswith(("http://", "https://")) or url in ("http:", "https:"):
                raise ValueError(f"{raw!r} is not an http:// or https:// URL")
            if url not in urls:
                urls.append(url)
    if not urls:
        raise ValueError("no server URL given")
    return tuple(urls)


def repeatable(method: str) -> bool:
    """Whether a request with this method may be sent again to another server after it
    may have reached one."""
    return method.upper() in REPEATABLE_METHODS


# NamedTuples, not the frozen keyword-only dataclasses used elsewhere: this module is on
# the path of every CLI command, where two dataclasses cost ~1 ms of start-up, these ~0.1.
class Failure(NamedTuple):
    """One try that got no answer: why (one line), and whether the request may have
    reached the server (and been acted on)."""

    reason: str
    sent: bool


class Switch(NamedTuple):
    """The sticky server changed: ``new`` answered after ``old`` failed (``why``)."""

    old: str
    new: str
    why: str


def failure_of(exc: BaseException) -> Failure:
    """An httpx error as a ``Failure``: not ``sent`` only when no connection was made
    (``ConnectError``, which covers a refused connection, an unknown name and a failed TLS
    handshake; ``ConnectTimeout``; ``PoolTimeout``: no connection free to send on). Any
    other error, a reset or a read timeout, came after the request went out."""
    import httpx

    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    not_sent = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
    return Failure(reason=reason, sent=not isinstance(exc, not_sent))


def proxy_failure(status: int) -> Failure:
    """A 502/503/504 from a proxy: the server behind it may have seen the request."""
    return Failure(reason=f"HTTP {status} from a proxy", sent=True)


class Servers:
    """One cluster's server URLs and what the last requests found of them (which
    answered last, which failed when): one per client, shared by its threads."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        cool_down_s: float = COOL_DOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("no server URL given")
        self.urls = tuple(urls)
        self.cool_down_s = cool_down_s
        self._clock = clock
        self._lock = threading.Lock()
        self._current = self.urls[0]
        self._failed: dict[str, tuple[float, str]] = {}  # url -> (when, why), until it answers

    @property
    def current(self) -> str:
        """The server that answered last (the first given, before any answered)."""
        return self._current

    def order(self) -> list[str]:
        """Whom to try, in turn: the current server, then the others as given; those
        that failed within the cool-down after all of them."""
        with self._lock:
            now = self._clock()
            ranked = [self._current, *(u for u in self.urls if u != self._current)]
            cooling = {u for u, (at, _) in self._failed.items() if now - at < self.cool_down_s}
        return [u for u in ranked if u not in cooling] + [u for u in ranked if u in cooling]

    def walk(self, *, repeatable: bool) -> Walk:
        """One request's way through the servers (see ``Walk``)."""
        return Walk(self, repeatable=repeatable)

    def note_failure(self, url: str, failure: Failure) -> None:
        with self._lock:
            self._failed[url] = (self._clock(), failure.reason)

    def note_answer(self, url: str) -> Switch | None:
        """``url`` answered: it becomes the current server. The switch, when it was not."""
        with self._lock:
            old, self._current = self._current, url
            self._failed.pop(url, None)
            if old == url:
                return None
            why = self._failed.get(old, (0.0, "did not answer"))[1]
        return Switch(old=old, new=url, why=why)


class Walk:
    """One request's tries, in ``Servers.order()`` as it was when the request began::

        walk = servers.walk(repeatable=False)
        for url in walk:
            try:
                resp = send(url)
            except httpx.HTTPError as exc:
                walk.failed(url, failure_of(exc))
                continue
            walk.answered(url)
            return resp
        raise OurError(walk.message())

    Iteration ends when every server was tried, or at the first failure after which
    this request must not be sent again (``sent`` and not ``repeatable``)."""

    def __init__(self, servers: Servers, *, repeatable: bool) -> None:
        self.servers = servers
        self.repeatable = repeatable
        self.tried: list[tuple[str, Failure]] = []
        self.stopped = False
        """The walk ended at a failure after which the request was not sent again."""
        self._order = servers.order()

    def __iter__(self) -> Iterator[str]:
        for url in self._order:
            if self.stopped:
                return
            yield url

    def failed(self, url: str, failure: Failure) -> bool:
        """Record a try that got no answer; True when the walk goes on to another server."""
        self.tried.append((url, failure))
        self.servers.note_failure(url, failure)
        self.stopped = failure.sent and not self.repeatable
        return not self.stopped and len(self.tried) < len(self._order)

    def answered(self, url: str) -> Switch | None:
        """Record the answer; the switch of current server it makes, if it does."""
        return self.servers.note_answer(url)

    def message(self) -> str:
        """Why the request got no answer, naming every server tried and its failure."""
        if not self.tried:
            return "no server to send the request to"
        url, last = self.tried[-1]
        earlier = "; ".join(f"{u} ({f.reason})" for u, f in self.tried[:-1])
        if self.stopped:
            untried = [u for u in self._order if u not in {t for t, _ in self.tried}]
            text = f"no answer from server {url} ({last.reason}) after the request was sent"
            if untried:
                text += (
                    f"; not sent again to {', '.join(untried)}, since {url} may have acted on it "
                    "(check before sending it again)"
                )
            return text + (f"; tried before: {earlier}" if earlier else "")
        if len(self.tried) == 1:
            verb = "no answer from server" if last.sent else "cannot reach server"
            return f"{verb} {url} ({last.reason})"
        return f"cannot reach any of {len(self.tried)} servers: " + "; ".join(
            f"{u} ({f.reason})" for u, f in self.tried
        )


class NoAnswer(Exception):
    """``first_answer`` got none: ``str()`` names every server tried and why; ``response``:
    the proxy's 502/503/504 that ended the walk, if one did (its ``status_code``)."""

    def __init__(self, message: str, response: Any = None) -> None:
        super().__init__(message)
        self.response = response

    @property
    def status(self) -> int | None:
        return None if self.response is None else int(self.response.status_code)


def first_answer(servers: Servers, send: Callable[[str], R], *, repeatable: bool) -> tuple[R, Switch | None]:
    """``send(url)``'s first answer (an httpx response) from ``servers`` in turn, by the
    rule above, and the switch of current server it made; ``NoAnswer`` when the walk
    ends without one (chained to the last httpx error). A proxy's 502/503/504 moves on
    only with several servers; with one, it is the answer (as it always was)."""
    import httpx

    walk = servers.walk(repeatable=repeatable)
    error: httpx.HTTPError | None = None
    for url in walk:
        try:
            resp = send(url)
        except httpx.HTTPError as exc:
            error = exc
            walk.failed(url, failure_of(exc))
            continue
        status = int(getattr(resp, "status_code", 0))
        if status in PROXY_DOWN and len(servers.urls) > 1:
            if walk.failed(url, proxy_failure(status)):
                continue
            raise NoAnswer(walk.message(), resp)
        return resp, walk.answered(url)
    raise NoAnswer(walk.message()) from error


__all__ = [
    "CONNECT_TIMEOUT_S",
    "COOL_DOWN_S",
    "PROXY_DOWN",
    "REPEATABLE_METHODS",
    "Failure",
    "NoAnswer",
    "Servers",
    "Switch",
    "Walk",
    "failure_of",
    "first_answer",
    "parse_urls",
    "proxy_failure",
    "repeatable",
]
