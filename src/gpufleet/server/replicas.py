"""What a service's replicas should do next: a pure function of the service's wish and
its replicas as last seen (Kubernetes' Deployment controller with ``maxSurge=1,
maxUnavailable=0``, and its ReplicaSet's recreate-on-exit).

Rules, applied in this order by ``decide``:

1. A replica taken out of the gateway (``draining_at``) is stopped once the drain time
   has passed: requests already sent to it finish first (the gateway stops sending new
   ones within a poll).
2. A replica that runs but is not ready ``readiness_timeout_s`` after it started is
   stopped as failed (a new one replaces it, by rule 4).
3. Deleting: every replica is drained (a not-ready one is stopped at once).
4. Same spec generation everywhere: missing replicas are created (lowest free slots);
   extra ones are drained, not-ready ones first (stopped at once), then the highest
   slots.
5. A rolling update (replicas of an older generation serve): replicas of the old
   generation that are not ready are stopped at once; one new replica is created while
   fewer than ``replicas`` of the new generation exist and fewer than ``replicas + 1``
   serve (surge one); an old ready replica is drained only while more than
   ``replicas`` ready ones serve, so ready capacity never drops below the wish: zero
   failed requests as long as replicas are healthy. Rollback is the same path (the old
   spec becomes a newer generation). On a full fleet the surge replica cannot start:
   once a new replica has waited ``surge_wait_s`` without being placed, one old ready
   replica is drained to make room (``maxUnavailable=1``; only with 2 or more replicas,
   so the service keeps serving while it rolls; requests still do not fail).

A replica "serves" when it is live (pending, scheduled or running) and not draining.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Wish:
    replicas: int
    generation: int
    readiness_timeout_s: float
    drain_s: float
    deleting: bool = False
    surge_wait_s: float = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica:
    job_id: int
    slot: int
    generation: int
    running: bool
    ready: bool
    started_at: float | None = None
    draining_at: float | None = None
    pending_since: float | None = None
    """When a replica that is not running yet was created (or requeued)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Create:
    slot: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Drain:
    job_id: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    job_id: int
    reason: str
    failed: bool = False


Action = Create | Drain | Stop


def _free_slots(taken: set[int]) -> list[int]:
    return [i for i in range(len(taken) + 64) if i not in taken]


def decide(wish: Wish, replicas: Sequence[Replica], now: float) -> list[Action]:
    """The actions for one service, in the order to apply them."""
    out: list[Action] = []
    serving: list[Replica] = []
    for r in replicas:
        if r.draining_at is not None:
            if now - r.draining_at >= wish.drain_s:
                out.append(Stop(job_id=r.job_id, reason=f"drained for {wish.drain_s:g}s"))
            continue
        if (
            r.running
            and not r.ready
            and r.started_at is not None
            and now - r.started_at > wish.readiness_timeout_s
        ):
            out.append(
                Stop(
                    job_id=r.job_id,
                    reason=f"not ready {wish.readiness_timeout_s:g}s after it started",
                    failed=True,
                )
            )
            continue
        serving.append(r)
    if wish.deleting:
        for r in serving:
            if r.ready:
                out.append(Drain(job_id=r.job_id, reason="service deleted"))
            else:
                out.append(Stop(job_id=r.job_id, reason="service deleted"))
        return out
    n, gen = wish.replicas, wish.generation
    old = [r for r in serving if r.generation != gen]
    current = [r for r in serving if r.generation == gen]
    if not old:
        return out + _scale(n, current)
    for r in old:
        if not r.ready:
            out.append(Stop(job_id=r.job_id, reason=f"replaced by generation {gen} (it was not ready)"))
    old = [r for r in old if r.ready]
    serving = current + old
    if len(current) < n and len(serving) < n + 1:
        slot = _free_slots({r.slot for r in serving})[0]
        out.append(Create(slot=slot, reason=f"rolling update to generation {gen}"))
    ready = sum(1 for r in serving if r.ready)
    spare = ready - n
    stuck = any(
        not r.running and r.pending_since is not None and now - r.pending_since >= wish.surge_wait_s
        for r in current
    )
    if stuck and n >= 2 and ready >= n:
        spare = ready - (n - 1)  # no room for a surge: one replica down at a time
    for r in sorted(old, key=lambda r: (-r.slot, r.job_id)):
        if spare <= 0:
            break
        out.append(Drain(job_id=r.job_id, reason=f"replaced by generation {gen}"))
        spare -= 1
    if len(current) > n:  # scaled down during the update
        out += _scale(n, current)
    return out


def _scale(n: int, current: list[Replica]) -> list[Action]:
    out: list[Action] = []
    if len(current) < n:
        for slot in _free_slots({r.slot for r in current})[: n - len(current)]:
            out.append(Create(slot=slot, reason=f"{len(current)} of {n} replicas"))
    elif len(current) > n:
        extra = sorted(current, key=lambda r: (r.ready, -r.slot, -r.job_id))[: len(current) - n]
        for r in extra:
            if r.ready:
                out.append(Drain(job_id=r.job_id, reason=f"scaled down to {n} replicas"))
            else:
                out.append(Stop(job_id=r.job_id, reason=f"scaled down to {n} replicas"))
    return out
