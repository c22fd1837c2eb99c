"""Which replica serves the next request: the feed's snapshot types, and per service a
``Pool`` that picks an endpoint and ejects failing ones. Pure: no I/O, no clock (every
call that needs the time takes ``now``, a monotonic second), no globals.

Choice (``Pool.choose``), over the endpoints not ejected:

1. fewest requests in flight *from this gateway* (the one signal that is fresh to the
   request; a slow replica keeps its requests longer and so gets fewer new ones);
2. then the lowest ``gpu_util`` band (10 points wide: the feed's figure is up to a
   refresh old, so 31 % and 38 % are the same; a finer order would send every request
   of a quiet period to whichever replica happened to read lowest). A replica whose
   utilisation is unknown (``None``) ranks as 100 %: a known-idle replica is a better
   bet than one we know nothing about, and a new replica still gets its share through
   rule 1 as soon as the others have requests in flight;
3. then round robin: the scan starts one endpoint further each time, and the first of
   the tied endpoints from there wins.

Passive outlier detection, as Envoy's (``outlier_detection``): a connection-level
failure (the replica refused the connection, did not accept it in time while idle, or
dropped a request it had begun to answer) ejects the endpoint at once;
``consecutive_5xx`` 5xx answers in a row eject it too. What is *not* a failure, and
leaves the endpoint's record as it was (``Outcome.BUSY``, ``Outcome.CLOSED``): a 503
(the replica says it is busy or loading: ejecting it would push its load onto the
others, which then look busy too, the cascade of issue 30), a connect timeout while it
has requests of ours in flight (alive, its accept queue full), and a reused keep-alive
connection closed before any answer (its idle timeout ran out: the request is resent).

Overload: ``choose(cap=...)`` skips endpoints with ``cap`` requests in flight; when
every one is at the cap the gateway answers 503 with ``Retry-After`` itself, instead
of piling more onto busy replicas until their connections time out. An ejection
lasts ``base_ejection_s`` doubled for each earlier ejection (10 s, 20 s, 40 s, ... at
most ``max_ejection_s``); the count of earlier ejections is forgotten once the endpoint
has been back for ``max_ejection_s``. At most ``max_ejection_percent`` of a service's
endpoints are out at once (Envoy's ``max_ejection_percent``, 50 by default: with one
replica nothing is ever ejected, with two at most one). If every endpoint is ejected
anyway (the feed shrank) the pool picks among all of them, as Envoy's panic mode:
a possibly bad replica beats a certain 503.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.ratelimit import Rate


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One ready replica, as the server's feed lists it."""

    id: str
    url: str
    job_id: int = 0
    replica: int = 0
    node: str = ""
    generation: int = 0
    gpu_util: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Service:
    name: str
    protocol: str = "http"
    tokens: frozenset[str] = frozenset()
    """sha256 hex digests of the service's valid tokens."""
    rate: Rate | None = None
    endpoints: tuple[Endpoint, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Feed:
    """The server's ``GET /v1/gateway/endpoints`` answer, parsed. ``skipped``: why
    entries that did not parse were left out (the rest of the feed still counts)."""

    at: float
    services: Mapping[str, Service] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()


def parse_feed(data: Any) -> Feed:
    """Raises ValueError when the document is not a feed at all; a malformed service
    or endpoint is skipped (with its reason in ``Feed.skipped``), never the whole feed."""
    if not isinstance(data, dict) or not isinstance(data.get("services"), list):
        raise ValueError("a feed is an object with a 'services' list")
    at = data.get("at", 0.0)
    if not isinstance(at, int | float):
        raise ValueError("'at' must be a number")
    services: dict[str, Service] = {}
    skipped: list[str] = []
    for i, raw in enumerate(data["services"]):
        try:
            svc = _service(raw, skipped)
        except (KeyError, TypeError, ValueError) as exc:
            skipped.append(f"services[{i}]: {exc!r}")
            continue
        services[svc.name] = svc
    return Feed(at=float(at), services=services, skipped=tuple(skipped))


def _service(raw: Any, skipped: list[str]) -> Service:
    name = raw["name"]
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"bad service name {name!r}")
    tokens = raw.get("tokens") or []
    if not all(isinstance(t, str) for t in tokens):
        raise TypeError("tokens must be strings")
    rate = raw.get("rate")
    endpoints: list[Endpoint] = []
    for j, e in enumerate(raw.get("endpoints") or []):
        try:
            util = e.get("gpu_util")
            endpoints.append(
                Endpoint(
                    id=str(e["id"]),
                    url=str(e["url"]).rstrip("/"),
                    job_id=int(e.get("job_id", 0)),
                    replica=int(e.get("replica", 0)),
                    node=str(e.get("node", "")),
                    generation=int(e.get("generation", 0)),
                    gpu_util=None if util is None else float(util),
                )
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            skipped.append(f"{name}.endpoints[{j}]: {exc!r}")
    return Service(
        name=name,
        protocol=str(raw.get("protocol", "http")),
        tokens=frozenset(t.lower() for t in tokens),
        rate=None if rate is None else Rate(burst=float(rate["burst"]), per_s=float(rate["per_s"])),
        endpoints=tuple(endpoints),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OutlierPolicy:
    consecutive_5xx: int = 5
    base_ejection_s: float = 10.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0


class Outcome(enum.Enum):
    OK = "ok"
    """Any answer below 500 (a 4xx is the client's fault, not the replica's)."""
    HTTP_5XX = "5xx"
    CONNECTION_FAILED = "connection"
    """Not reached, reset, or no answer in time: counts at once."""
    ABANDONED = "abandoned"
    """The client went away first: no verdict on the replica."""
    BUSY = "busy"
    """A 503, or no accept in time while it serves other requests: no verdict."""
    CLOSED = "closed"
    """A reused connection closed before any answer (idle timeout): no verdict."""


NO_VERDICT = frozenset({Outcome.ABANDONED, Outcome.BUSY, Outcome.CLOSED})


def util_rank(util: float | None) -> int:
    """The ``gpu_util`` band used to order endpoints (unknown ranks as 100 %)."""
    if util is None or math.isnan(util):
        return 10
    return min(10, max(0, int(util // 10)))


class Slot:
    """An endpoint and this gateway's state about it. Requests in flight hold their
    slot, so a slot dropped from the pool (its replica left the feed) is still
    released correctly."""

    __slots__ = ("ejected_until", "ejections", "endpoint", "failures", "in_flight", "rank")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.rank = util_rank(endpoint.gpu_util)
        self.in_flight = 0
        self.failures = 0
        self.ejected_until = 0.0
        self.ejections = 0

    def ejected(self, now: float) -> bool:
        return self.ejected_until > now

    def __repr__(self) -> str:
        return f"Slot({self.endpoint.id}, in_flight={self.in_flight}, ejected_until={self.ejected_until})"


class Pool:
    """The endpoints of one service (not thread-safe: one event loop owns it)."""

    __slots__ = ("_next", "policy", "service", "slots")

    def __init__(self, service: Service, policy: OutlierPolicy = OutlierPolicy()) -> None:
        self.policy = policy
        self.service = service
        self.slots: list[Slot] = [Slot(e) for e in service.endpoints]
        self._next = 0

    def update(self, service: Service) -> None:
        """The feed's new list: slots of endpoints that stay (same id and URL) keep
        their in-flight count and ejection state; new ones start fresh."""
        old = {(s.endpoint.id, s.endpoint.url): s for s in self.slots}
        slots = []
        for e in service.endpoints:
            slot = old.get((e.id, e.url))
            if slot is None:
                slot = Slot(e)
            else:
                slot.endpoint, slot.rank = e, util_rank(e.gpu_util)
            slots.append(slot)
        self.service, self.slots = service, slots

    def choose(self, now: float, avoid: Slot | None = None, cap: int = 0) -> Slot | None:
        """The endpoint for the next request (see the module docstring); ``avoid``:
        never this one (a retry goes elsewhere); ``cap``: none with that many requests in
        flight (0: no cap). None: no endpoint to use."""
        slots = self.slots
        n = len(slots)
        if n == 0:
            return None
        start = self._next % n
        self._next = start + 1
        best = self._scan(slots, n, start, now, avoid, cap)
        if best is None:  # all ejected: panic mode
            best = self._scan(slots, n, start, math.inf, avoid, cap)
        return best

    @staticmethod
    def _scan(slots: list[Slot], n: int, start: int, now: float, avoid: Slot | None, cap: int) -> Slot | None:
        best: Slot | None = None
        best_load = best_rank = 0
        for i in range(n):
            s = slots[(start + i) % n]
            if s is avoid or s.ejected_until > now or (cap and s.in_flight >= cap):
                continue
            if best is None or s.in_flight < best_load or (s.in_flight == best_load and s.rank < best_rank):
                best, best_load, best_rank = s, s.in_flight, s.rank
        return best

    def begin(self, slot: Slot) -> None:
        slot.in_flight += 1

    def end(self, slot: Slot, outcome: Outcome, now: float) -> bool:
        """Record how a request on ``slot`` ended; True when it got the slot ejected."""
        slot.in_flight -= 1
        if outcome is Outcome.OK:
            slot.failures = 0
            return False
        if outcome in NO_VERDICT:
            return False
        slot.failures += 1
        if outcome is Outcome.HTTP_5XX and slot.failures < self.policy.consecutive_5xx:
            return False
        return self.eject(slot, now)

    def eject(self, slot: Slot, now: float) -> bool:
        """Eject ``slot`` unless it is out already or the cap forbids (see above)."""
        if slot.ejected(now) or slot not in self.slots:
            return False
        out = sum(1 for s in self.slots if s.ejected(now))
        if (out + 1) * 100 > self.policy.max_ejection_percent * len(self.slots):
            return False
        p = self.policy
        if slot.ejections and now - slot.ejected_until >= p.max_ejection_s:
            slot.ejections = 0  # back long enough: start again from the base time
        slot.ejected_until = now + min(p.max_ejection_s, p.base_ejection_s * 2**slot.ejections)
        slot.ejections += 1
        slot.failures = 0
        return True

    def ejected_count(self, now: float) -> int:
        return sum(1 for s in self.slots if s.ejected(now))


class Balancer:
    """Every service's pool; ``update`` takes each new feed."""

    __slots__ = ("policy", "pools")

    def __init__(self, policy: OutlierPolicy = OutlierPolicy()) -> None:
        self.policy = policy
        self.pools: dict[str, Pool] = {}

    def update(self, feed: Feed) -> None:
        pools: dict[str, Pool] = {}
        for name, service in feed.services.items():
            pool = self.pools.get(name)
            if pool is None:
                pool = Pool(service, self.policy)
            else:
                pool.update(service)
            pools[name] = pool
        self.pools = pools

    def pool(self, name: str) -> Pool | None:
        return self.pools.get(name)


__all__ = [
    "Balancer",
    "Endpoint",
    "Feed",
    "Outcome",
    "OutlierPolicy",
    "Pool",
    "Service",
    "Slot",
    "parse_feed",
    "util_rank",
]
