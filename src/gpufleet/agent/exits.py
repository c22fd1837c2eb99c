"""The agent learns that a job's process ended the moment it ends, not at its next tick.

One thread per agent waits on a Linux ``pidfd`` of every process it started (readable
once the process has exited, before it is reaped) with ``epoll``; an exit kicks the
agent's loop, which polls its jobs and reports the exit in the next sync. Without
``pidfd_open`` (not Linux, a kernel before 5.3) nothing is watched and the agent's tick
finds exits as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

log = logging.getLogger("gpufleet.agent")

SUPPORTED = hasattr(os, "pidfd_open") and hasattr(select, "epoll")


class ExitWatch:
    def __init__(self, kick: Callable[[], None]) -> None:
        self.kick = kick
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._epoll: select.epoll | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, pid: int) -> None:
        """Kick once ``pid`` (a process this agent started) has exited."""
        if not SUPPORTED or self._closed:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already gone (the tick will find it) or not allowed
            return
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                self._thread = threading.Thread(target=self._run, name="gpufleet-exits", daemon=True)
                self._thread.start()
            self._fds[fd] = pid
            self._epoll.register(fd, select.EPOLLIN)

    def _run(self) -> None:
        ep = self._epoll
        assert ep is not None
        while not self._closed:
            try:
                events = ep.poll(1.0)
            except (OSError, ValueError):
                return  # closed
            if not events:
                continue
            with self._lock:
                for fd, _ in events:
                    if self._fds.pop(fd, None) is not None:
                        with contextlib.suppress(OSError):
                            ep.unregister(fd)
                        os.close(fd)
            self.kick()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            if self._epoll is not None:
                self._epoll.close()
