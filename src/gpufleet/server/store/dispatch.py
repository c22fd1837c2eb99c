"""Push dispatch: an agent learns the moment its node's desired set may have changed.

The agent's periodic sync (``POST /v1/nodes/{name}/sync``) stays the protocol and the
liveness signal; this adds a *doorbell*. An agent keeps one long-poll open,
``GET /v1/nodes/{name}/wait?seen=V``, answered as soon as its node's version differs
from ``V`` (at once if it already does) or after ``timeout`` seconds with the same
version; it then syncs at once. Kubernetes' watch and Nomad's blocking queries
(``?index=N``) are the anchors: a version, not an event stream, so nothing is ever
"missed" — a ring between two waits leaves the version moved and the next wait returns
at once.

What rings a node (``touch``): the writes that change the set of attempts it should
run, which are exactly two (``nodework.desired`` is the allocations of active jobs):

* the scheduling pass's commit: the nodes of the attempts it started
  (``loops/plancommit.py``);
* ``release_attempt``: the nodes that must stop an attempt (a cancel, a preemption, a
  time limit, a drained replica; not the node that reported the exit itself).

A touch is one of a transaction's after-commit marks (``effects.py``, the convention
for everything a commit sets off) and is rung only *after* the commit
(``Database.write``, the group-commit writer): an agent woken before the commit would
sync, read the old set, and wait again until its periodic sync. A scheduling pass in
the child process (``loops/child.py``) sends the nodes it touched to the API process on
its report pipe. A transaction rolled back rings nothing, nor does a savepoint the
group commit rolled back.

A version is ``BOOT.N``: ``BOOT`` is random per server process, so an agent that waited
on a server that restarted gets an answer at once (its version is from another boot)
and re-syncs, instead of waiting out its timeout. Waiting costs one asyncio future on
the server's event loop, no thread: ``bench/bench_agents.py`` shows 1,000 agents
waiting. A closing server answers every waiter (``close``), so shutdown never waits
for long-polls.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterable

from sqlalchemy.orm import Session

from gpufleet.server.store import effects


def touch(s: Session, nodes: Iterable[str]) -> None:
    """Ring ``nodes`` once the transaction of ``s`` has committed."""
    effects.touch(s, nodes)


class NodeBell:
    """Per-node versions and the long-polls waiting on them. ``ring`` may be called from
    any thread; ``wait`` runs on the server's event loop."""

    def __init__(self) -> None:
        self.boot = secrets.token_hex(4)
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._closed = False
        self.rings = 0
        """Nodes rung since start (``gpufleet_dispatch_rings_total``)."""

    def version(self, node: str) -> str:
        with self._lock:
            return f"{self.boot}.{self._versions.get(node, 0)}"

    @property
    def waiting(self) -> int:
        """Long-polls open now."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    def ring(self, nodes: Iterable[str]) -> None:
        woken: list[asyncio.Future[None]] = []
        with self._lock:
            for node in nodes:
                self._versions[node] = self._versions.get(node, 0) + 1
                self.rings += 1
                woken += self._waiters.pop(node, ())
        _wake(woken)

    def close(self) -> None:
        """Answer every waiter now and every later one at once (shutdown)."""
        with self._lock:
            self._closed = True
            woken = [f for w in self._waiters.values() for f in w]
            self._waiters.clear()
        _wake(woken)

    async def wait(self, node: str, seen: str | None, timeout_s: float) -> str:
        """The node's version once it differs from ``seen``, or after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            now = f"{self.boot}.{self._versions.get(node, 0)}"
            if now != seen or self._closed or timeout_s <= 0:
                return now
            self._waiters.setdefault(node, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                mine = self._waiters.get(node)
                if mine is not None:
                    mine.discard(fut)
                    if not mine:
                        del self._waiters[node]
        return self.version(node)


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        loop = fut.get_loop()
        if loop.is_closed():
            continue
        try:
            loop.call_soon_threadsafe(_set, fut)
        except RuntimeError:  # the loop closed meanwhile
            continue


def _set(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
