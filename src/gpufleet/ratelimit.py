"""Rate limits: a token bucket per user, and a failed-authentication throttle per
source address.

The per-user bucket is Slurm's ``rl_enable`` (``SlurmctldParameters=rl_bucket_size,
rl_refill_rate``): every API request a user makes takes a token from their bucket; an
empty bucket answers 429 with ``Retry-After`` (the seconds until a token is back)
instead of doing the work. Decisions where Slurm is silent or does not fit:

* The bucket is per *user*, not per token (a user with ten tokens has one bucket), and
  its size and refill rate are per role (``--rate-user`` / ``--rate-operator`` /
  ``--rate-admin``): operators and admins drive tooling, so their default is ten times
  a user's. Node credentials are in no bucket: agents are admitted by their own lane
  (``lanes.py``), and an agent that syncs with an operator's token is still an agent
  (a sync takes no token from that operator's bucket).
* A request costs one token, except a list page, which costs one per 100 items it asks
  for (``limit``): its cost grows with the page, as Kubernetes' API Priority and
  Fairness sizes a LIST by the objects it may return. A bucket never holds more than
  ``burst``, and a request costing more than ``burst`` costs ``burst``.
* The bucket is refilled lazily on each take (no timer), from a monotonic clock that is
  a seam (``now=``), so tests drive it with a fake clock.
* Buckets live in this process only: with several servers behind one address each
  keeps its own (Slurm's controller is one process too). Idle buckets that are full
  are forgotten when there are many (``max_keys``), so memory stays bounded.

Failed authentication (any 401) is counted per source address in a bucket of its own:
``--auth-failures N/WINDOW`` lets N failures through per WINDOW (refilled evenly);
once it is empty, a request from that address whose credential the server does not
already know (its token cache) is answered 429 without a database lookup, until a
failure's worth has refilled. Valid credentials keep working whatever their address
did (verify first, throttle failures only: ``lanes.py``): a credential the server does
not hold in its cache is looked up when ``KnownDigests`` holds its digest, and refused
without the database when it does not. So one mistyped token, or a flood, behind a shared
address does not lock out anyone with a valid credential behind it. The address is the
one uvicorn reports: the peer's, or ``X-Forwarded-For`` only when the peer is a proxy
named by ``--trusted-proxy`` (default none: ``gpufleet.server.forwarding``).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

Now = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic``; a fake one in tests)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    """A bucket of ``burst`` tokens refilled at ``per_s`` tokens a second."""

    burst: float
    per_s: float

    def __post_init__(self) -> None:
        if not (self.burst >= 1 and self.per_s > 0):
            raise ValueError(f"a rate needs burst >= 1 and a refill rate > 0, got {self.burst}/{self.per_s}")

    @classmethod
    def parse(cls, text: str) -> Rate | None:
        """``BURST/PER_SECOND`` (``30/10``), or ``BURST/DURATION`` with a unit (``20/1m``:
        20 tokens, refilled over a minute); ``off`` is no limit (None)."""
        text = text.strip().lower()
        if text in ("off", "none", "0"):
            return None
        m = re.fullmatch(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)(ms|s|m|h)?", text)
        if m is None:
            raise ValueError(f"expected BURST/RATE (30/10), N/WINDOW (20/1m) or off, got {text!r}")
        burst, amount, unit = float(m[1]), float(m[2]), m[3]
        if unit is None:
            return cls(burst=burst, per_s=amount)
        window_s = amount * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
        if window_s <= 0:
            raise ValueError(f"the window must be longer than 0, got {text!r}")
        return cls(burst=burst, per_s=burst / window_s)

    def __str__(self) -> str:
        return f"{self.burst:g}/{self.per_s:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimits:
    """What ``gpufleet server`` allows (see the module docstring); None: no limit."""

    user: Rate | None = Rate(burst=30, per_s=10)
    operator: Rate | None = Rate(burst=300, per_s=100)
    admin: Rate | None = Rate(burst=300, per_s=100)
    auth_failures: Rate | None = Rate(burst=20, per_s=20 / 60)
    """N failed authentications per address per window (default 20 a minute)."""

    def for_role(self, role: str) -> Rate | None:
        return {"admin": self.admin, "operator": self.operator}.get(role, self.user)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneSizes:
    """Seats (requests at once) per lane of ``lanes.Admission``; each lane queues up to
    ``queue_per_seat`` x its seats for up to ``wait_s``, then answers 429. The node
    lane is sized for bursts of syncs; the user lane is kept small because the API
    process is one interpreter: more user requests at once do not finish sooner, they
    only take the interpreter from the others."""

    node: int = 16
    admin: int = 8
    user: int = 4
    queue_per_seat: int = 16
    wait_s: float = 10.0

    def __post_init__(self) -> None:
        if min(self.node, self.admin, self.user, self.queue_per_seat) < 1 or self.wait_s <= 0:
            raise ValueError("every lane needs at least one seat, a queue and a wait > 0")


class TokenBucket:
    """``take`` answers 0.0 (taken) or the seconds until ``cost`` tokens are there
    (nothing taken). Not thread-safe: ``Buckets`` locks around it."""

    __slots__ = ("rate", "stamp", "tokens")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self.tokens = rate.burst
        self.stamp = now

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.rate.burst, self.tokens + (now - self.stamp) * self.rate.per_s)
            self.stamp = now

    def take(self, cost: float, now: float) -> float:
        cost = min(cost, self.rate.burst)
        self.refill(now)
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate.per_s

    def wait(self, cost: float, now: float) -> float:
        """The seconds until ``cost`` tokens are there (0.0: now), taking nothing."""
        self.refill(now)
        return max(0.0, (min(cost, self.rate.burst) - self.tokens) / self.rate.per_s)

    def full(self, now: float) -> bool:
        self.refill(now)
        return self.tokens >= self.rate.burst


@dataclass(slots=True)
class Buckets:
    """One bucket per key, made full on first use; its rate may change (a user's role
    changed): the bucket then keeps its tokens, capped at the new burst."""

    now: Now = time.monotonic
    max_keys: int = 100_000
    _buckets: dict[Hashable, TokenBucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, key: Hashable, rate: Rate, cost: float = 1.0) -> float:
        """0.0: admitted; else the seconds to wait (``Retry-After``)."""
        t = self.now()
        with self._lock:
            bucket = self._bucket(key, rate, t)
            return bucket.take(cost, t)

    def wait(self, key: Hashable, cost: float = 1.0) -> float:
        """The seconds until ``key`` has ``cost`` tokens (0.0: now, or no bucket yet)."""
        t = self.now()
        with self._lock:
            bucket = self._buckets.get(key)
            return 0.0 if bucket is None else bucket.wait(cost, t)

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, key: Hashable, rate: Rate, t: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget_full(t)
            bucket = self._buckets[key] = TokenBucket(rate, t)
        elif bucket.rate != rate:
            bucket.refill(t)
            bucket.rate, bucket.tokens = rate, min(bucket.tokens, rate.burst)
        return bucket

    def _forget_full(self, t: float) -> None:
        """Full buckets carry no state (a new one starts full): drop them; if every
        bucket is in use, drop the oldest half rather than grow without bound."""
        full = [k for k, b in self._buckets.items() if b.full(t)]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.max_keys:
            for k in list(self._buckets)[: self.max_keys // 2]:
                del self._buckets[k]


@dataclass(slots=True)
class AuthThrottle:
    """Failed authentications per source address (see the module docstring)."""

    rate: Rate | None
    buckets: Buckets = field(default_factory=Buckets)

    def failed(self, address: str) -> None:
        if self.rate is not None:
            self.buckets.take(address, self.rate)

    def retry_after(self, address: str) -> float:
        """0.0: this address may try an unknown credential; else seconds to wait."""
        return 0.0 if self.rate is None else self.buckets.wait(address)


@dataclass(slots=True)
class KnownDigests:
    """The digests of every live credential, in memory: what a throttled address's
    unknown token is checked against before it may cost a database look-up. Re-read
    (``load``, in a worker thread) when a token is not found, at most every ``refresh_s``
    unless this server made a credential since (``invalidate``): a token made on another
    server in the last ``refresh_s`` may be refused (429) for that long to a throttled
    address, never to another one. Memory: one digest (64 characters) per live token and
    node credential."""

    load: Callable[[], frozenset[str]]
    refresh_s: float = 2.0
    now: Now = time.monotonic
    _digests: frozenset[str] = frozenset()
    _loaded_at: float = float("-inf")

    def holds(self, digests: Iterable[str]) -> bool:
        return any(d in self._digests for d in digests)

    def stale(self) -> bool:
        return self.now() - self._loaded_at >= self.refresh_s

    def invalidate(self) -> None:
        self._loaded_at = float("-inf")

    def reload(self) -> None:
        if not self.stale():  # another request reloaded it meanwhile
            return
        self._loaded_at = self.now()
        self._digests = self.load()


def retry_after_header(seconds: float) -> str:
    """Whole seconds, at least 1 (``Retry-After`` takes no fractions)."""
    return str(max(1, math.ceil(seconds)))
