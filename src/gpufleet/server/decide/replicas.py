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
5. A rolling update (replicas of an older generation serve), as a Kubernetes Deployment
   with ``maxSurge`` / ``maxUnavailable`` (``Wish.max_surge``, default 1;
   ``Wish.max_unavailable``, default 0): replicas of the old generation that are not
   ready are stopped at once; new replicas are created while fewer than ``replicas`` of
   the new generation exist and fewer than ``replicas + max_surge`` serve; an old ready
   replica is drained only while more than ``replicas - max_unavailable`` ready ones
   serve. With the defaults ready capacity never drops below the wish: an old replica
   goes only once a new one is ready, so a new generation that never gets ready (a bad
   command, a crash loop) leaves every old replica serving. On a full fleet the surge
   replica waits for room; ``max_unavailable: 1`` lets one old replica at a time make
   room instead. Rollback is the same path (the old spec becomes a newer generation).
   Whether a rollout is stuck is ``rollout_status``'s answer (Kubernetes'
   ``progressDeadlineSeconds``), which changes no decision: the controller keeps trying.

   A replica whose node is draining (``Replica.evicted``: a drain, a rolling driver
   upgrade) is replaced the same way, surge first: a new replica is created elsewhere
   and the evicted one drained only once enough others are ready, so a drain never
   takes a service below its ready count where the fleet has room for the surge (a
   warm one there is stopped at once and refilled elsewhere). Where it has none, the
   drain's own timeout requeues the replica (``lifecycle.py``).

6. The warm pool (``warm``: standby replicas, started and ready, not in rotation): a
   replica short of the wish is made by promoting a warm one first (ready ones first: it
   takes traffic at once), and only then by creating one; the pool is then refilled
   behind it. A replica no longer wished is demoted to the pool if the pool is short,
   else drained. Warm replicas of an older generation are stopped at once.

A replica "serves" when it is live (pending, scheduled or running) and not draining;
warm replicas are live and not draining, but the gateways do not see them.
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
    warm: int = 0
    max_surge: int = 1
    max_unavailable: int = 0
    progress_deadline_s: float = 600.0


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
    warm: bool = False
    evicted: bool = False
    """Its node is draining: move it elsewhere, surge first (rule 5)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Create:
    slot: int
    reason: str
    warm: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Promote:
    """A warm replica joins the rotation."""

    job_id: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Demote:
    """A serving replica leaves the rotation for the warm pool (it keeps running)."""

    job_id: int
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


Action = Create | Drain | Stop | Promote | Demote


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
            if r.ready and not r.warm:
                out.append(Drain(job_id=r.job_id, reason="service deleted"))
            else:
                out.append(Stop(job_id=r.job_id, reason="service deleted"))
        return out
    n, gen = wish.replicas, wish.generation
    for r in serving:
        if r.warm and r.generation != gen:
            out.append(Stop(job_id=r.job_id, reason=f"warm replica replaced by generation {gen}"))
        elif r.warm and r.evicted:
            out.append(Stop(job_id=r.job_id, reason="warm replica on a draining node"))
    serving = [r for r in serving if not (r.warm and (r.generation != gen or r.evicted))]
    old = [r for r in serving if r.generation != gen or r.evicted]
    current = [r for r in serving if r.generation == gen and not r.warm and not r.evicted]
    warm = [r for r in serving if r.warm]
    if not old:
        return out + _scale(n, wish.warm, current, warm)
    if any(r.generation != gen for r in old):
        why, made = f"replaced by generation {gen}", f"rolling update to generation {gen}"
    else:
        why = made = "moved off its draining node"
    if len(current) < n and warm:  # a warm replica of the new generation is the surge
        best = min(warm, key=lambda r: (not r.ready, r.slot))
        out.append(Promote(job_id=best.job_id, reason=made))
        current.append(best)
        warm.remove(best)
    for r in old:
        if not r.ready:
            out.append(Stop(job_id=r.job_id, reason=f"{why} (it was not ready)"))
    old = [r for r in old if r.ready]
    taken = {r.slot for r in current + old + warm}
    serving = current + old
    room = min(n - len(current), n + wish.max_surge - len(serving))
    for slot in _free_slots(taken)[: max(0, room)]:
        out.append(Create(slot=slot, reason=made))
    ready = sum(1 for r in serving if r.ready)
    spare = ready - max(0, n - wish.max_unavailable)
    for r in sorted(old, key=lambda r: (-r.slot, r.job_id)):
        if spare <= 0:
            break
        out.append(Drain(job_id=r.job_id, reason=why))
        spare -= 1
    if len(current) > n:  # scaled down during the update
        out += _scale(n, 0, current, [])
    return out


def _scale(n: int, pool: int, current: list[Replica], warm: list[Replica]) -> list[Action]:
    """Serving replicas to ``n`` (warm ones promoted first), then the warm pool to ``pool``."""
    out: list[Action] = []
    taken = {r.slot for r in current + warm}
    warm = sorted(warm, key=lambda r: (not r.ready, r.slot))
    if len(current) < n:
        short = n - len(current)
        for r in warm[:short]:
            out.append(
                Promote(
                    job_id=r.job_id, reason=f"{len(current)} of {_replicas(n)}: promoted from the warm pool"
                )
            )
        made = len(current) + min(short, len(warm))
        warm = warm[short:]
        for slot in _free_slots(taken)[: n - made]:
            out.append(Create(slot=slot, reason=f"{made} of {_replicas(n)}"))
            taken.add(slot)
    elif len(current) > n:
        extra = sorted(current, key=lambda r: (r.ready, -r.slot, -r.job_id))[: len(current) - n]
        for r in extra:
            if not r.ready:
                out.append(Stop(job_id=r.job_id, reason=f"scaled down to {_replicas(n)}"))
            elif len(warm) < pool:
                out.append(Demote(job_id=r.job_id, reason=f"scaled down to {_replicas(n)}: to the warm pool"))
                warm.append(r)
            else:
                out.append(Drain(job_id=r.job_id, reason=f"scaled down to {_replicas(n)}"))
    if len(warm) < pool:
        for slot in _free_slots(taken)[: pool - len(warm)]:
            out.append(Create(slot=slot, reason=f"warm pool {len(warm)} of {pool}", warm=True))
            taken.add(slot)
    elif len(warm) > pool:
        for r in sorted(warm, key=lambda r: (r.ready, -r.slot))[: len(warm) - pool]:
            out.append(Stop(job_id=r.job_id, reason=f"warm pool down to {pool}"))
    return out


def _replicas(n: int) -> str:
    """``1 replica``, ``3 replicas`` (the CLI's ``words.count``: the server imports nothing
    of the CLI)."""
    return f"{n} replica{'' if n == 1 else 's'}"


STALL_EXITS = 3
"""Exits of the current generation's replicas (since it began) that make a rollout
stalled before its deadline: a crash loop will not heal by waiting."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """What the controller observed of the current generation, besides its replicas:
    when it began (the deploy or the update that made it), how many of its replicas
    exited since (failed, timed out, or ended), and what the last one said."""

    since: float
    exits: int = 0
    last_exit: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rollout:
    """``complete``: ``replicas`` ready replicas of the current generation serve and no
    older one does; ``progressing``; ``stalled``: not complete ``progress_deadline_s``
    after the generation began, or its replicas exited ``STALL_EXITS`` times. A stalled
    rollout is a statement, not a decision: old replicas keep serving and the controller
    keeps trying (Kubernetes' ``ProgressDeadlineExceeded``)."""

    state: str
    generation: int
    reason: str


def rollout_status(wish: Wish, replicas: Sequence[Replica], progress: Progress, now: float) -> Rollout:
    gen, n = wish.generation, wish.replicas
    live = [r for r in replicas if r.draining_at is None and not r.warm]
    old = [r for r in live if r.generation != gen]
    ready = sum(1 for r in live if r.generation == gen and r.ready)
    if ready >= n and not old:
        return Rollout(state="complete", generation=gen, reason=f"{ready} of {_replicas(n)} ready")
    what = f"{ready} of {_replicas(n)} of generation {gen} ready"
    if old:
        what += f", {len(old)} older still serving"
    if progress.exits >= STALL_EXITS:
        last = f" (last: {progress.last_exit})" if progress.last_exit else ""
        why = f"its replicas exited {progress.exits} times{last}"
        return Rollout(state="stalled", generation=gen, reason=f"{what}: {why}")
    waited = now - progress.since
    if waited >= wish.progress_deadline_s:
        why = f"no progress within {wish.progress_deadline_s:g}s (progress deadline)"
        return Rollout(state="stalled", generation=gen, reason=f"{what}: {why}")
    return Rollout(state="progressing", generation=gen, reason=what)
