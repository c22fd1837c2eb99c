"""The agent's doorbell: a long-poll that tells it to sync now (``server/store/dispatch.py``).

Where the transport can long-poll (``WaitTransport``), one thread keeps a
``GET /v1/nodes/{name}/wait`` open; an answer with a new version means the node's
desired set may have changed, and the doorbell rings (the agent syncs at once, no gap).
The periodic sync stays the safety net (a lost long-poll, a server without the
endpoint) and the liveness signal, so the doorbell never dies: a failure backs off and
polls again; a server without the endpoint (404, 405) ends it for good.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from gpufleet.agent.transport import AgentTransportError, SyncTransport, WaitTransport

log = logging.getLogger("gpufleet.agent")


class Doorbell:
    """``ring`` is called (from the doorbell's thread) on each new version; ``wait_s`` is
    how long one long-poll waits, ``retry_max_s`` the longest back-off after failures."""

    def __init__(self, *, node: str, wait_s: float, retry_max_s: float, ring: Callable[[], None]) -> None:
        self.node = node
        self.wait_s = wait_s
        self.retry_max_s = retry_max_s
        self.ring = ring
        self._thread: threading.Thread | None = None
        self.answers = 0
        """Long-polls answered so far (tests wait for the first: the agent at rest)."""

    def start(self, transport: SyncTransport, stop: threading.Event) -> None:
        """Keep a long-poll open until ``stop`` (where the transport can; once)."""
        if self._thread is not None or not isinstance(transport, WaitTransport):
            return
        self._thread = threading.Thread(
            target=self._watch, args=(transport, stop), name=f"gpufleet-wait-{self.node}", daemon=True
        )
        self._thread.start()

    def _watch(self, waiter: WaitTransport, stop: threading.Event) -> None:
        seen: str | None = None
        failures = 0
        while not stop.is_set():
            try:
                # a random timeout spreads the renewals of a whole fleet's long-polls (after a
                # server restart they would all come at once); Kubernetes' watches do the same
                timeout = self.wait_s * random.uniform(0.75, 1.25)
                version = waiter.wait(self.node, seen, timeout)
            except AgentTransportError as exc:
                if exc.status in (404, 405):
                    log.info("node %s: the server has no long-poll: periodic syncs only", self.node)
                    return
                failures += 1  # down, restarting, or refusing us: the periodic sync says which
                stop.wait(min(self.retry_max_s, 0.5 * 2 ** min(failures, 6)))
                continue
            except Exception:  # never die: the periodic sync carries on regardless
                log.exception("node %s: long-poll failed", self.node)
                failures += 1
                stop.wait(min(self.retry_max_s, 0.5 * 2 ** min(failures, 6)))
                continue
            failures = 0
            self.answers += 1
            if version != seen:  # the first answer too: something may have changed since our last sync
                seen = version
                self.ring()
