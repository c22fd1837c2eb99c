"""Group commit: many small write transactions from concurrent requests share one
commit (one fsync), without weakening durability.

Each caller hands a function of a Session and blocks until the transaction holding its
work has committed; only then does it answer (a 201 still means "on disk"). Each
function runs inside its own SAVEPOINT, so one that raises or returns a ``Failure``
leaves nothing behind and does not affect its neighbours.

``InlineWriter`` is the same seam without batching (direct mode, tests).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from sqlalchemy.orm import Session

from gpufleet.server.db import Database
from gpufleet.server.problems import Failure

T = TypeVar("T")
log = logging.getLogger("gpufleet.server")


class Writer(Protocol):
    def run(self, fn: Callable[[Session], T]) -> T: ...


class InlineWriter:
    def __init__(self, db: Database) -> None:
        self.db = db

    def run(self, fn: Callable[[Session], T]) -> T:
        with self.db.write() as s:
            return fn(s)


_Item = tuple[Callable[[Session], Any], "Future[Any]"]


class GroupCommitWriter:
    def __init__(self, db: Database, *, max_batch: int = 128) -> None:
        self.db = db
        self.max_batch = max_batch
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-writer", daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[Session], T]) -> T:
        fut: Future[T] = Future()
        self._q.put((fn, fut))
        return fut.result()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        done: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            with self.db.write() as s:
                for fn, fut in batch:
                    sp = s.begin_nested()
                    try:
                        result = fn(s)
                    except Exception as exc:
                        sp.rollback()
                        done.append((fut, None, exc))
                        continue
                    if isinstance(result, Failure):
                        sp.rollback()
                    else:
                        sp.commit()
                    done.append((fut, result, None))
        except Exception as exc:  # the commit itself failed: nobody's work is durable
            log.warning("group commit of %d writes failed: %s", len(batch), exc)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for fut, result, error in done:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
