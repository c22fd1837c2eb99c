"""Group commit: many small write transactions from concurrent requests share one
commit (one fsync), without weakening durability.

Each caller hands its work and waits until the transaction holding it has committed;
only then does it answer (a 201 still means "on disk"). Two kinds of work:

* ``run(fn)``: a function of a Session. It runs inside its own SAVEPOINT, so one that
  raises or returns a ``Failure`` leaves nothing behind and does not affect its
  neighbours.
* ``apply(op, item)`` / ``await call(writer, op, item)``: one item of a *bulk*
  operation. All items of the same ``op`` in a batch go to one ``op(session, items)``
  call, so the hot path (job submission) pays for a few statements per batch instead
  of a few per request. ``op`` returns one result per item, in order; an item it
  refuses is a ``Failure`` that wrote nothing (so no SAVEPOINT is needed). If ``op``
  raises, the whole transaction is rolled back and the batch is redone *carefully*:
  every item alone in its own SAVEPOINT, so one bad item fails only its own caller.

While busy, the writer thread keeps one connection (given back to the pool after a
second idle or an error) and a batch is one ``BEGIN IMMEDIATE ... COMMIT`` on it. A
caller that gave up before its batch started (its request was cancelled) is skipped
and writes nothing. What a batch marked to follow its commit (``effects.py``: nodes to
ring, loops to wake, caches to drop) is set off once it has committed, before its
callers are answered. ``InlineWriter`` is the same seam without batching (tests, tools).

Its thread is not a ``runner.Loop``, on purpose: it is a request-path batcher that callers
wait on, not a periodic step; it stops after the loops, at ``close()``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from gpufleet.server.problems import Failure
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")
log = logging.getLogger("gpufleet.server")

BulkOp = Callable[[Session, Sequence[P]], list[R]]
"""Writes for many items in the caller's transaction; one result (or Failure) per item."""


class Writer(Protocol):
    def run(self, fn: Callable[[Session], T]) -> T: ...

    def apply(self, op: BulkOp[P, R], item: P) -> Future[R]: ...


async def call(writer: Writer, op: BulkOp[P, R], item: P) -> R:
    """``apply`` for async handlers: wait for the commit without holding a thread."""
    return await asyncio.wrap_future(writer.apply(op, item))


class InlineWriter:
    def __init__(self, db: Database) -> None:
        self.db = db

    def run(self, fn: Callable[[Session], T]) -> T:
        with self.db.write() as s:
            return fn(s)

    def apply(self, op: BulkOp[P, R], item: P) -> Future[R]:
        fut: Future[R] = Future()
        try:
            with self.db.write() as s:
                result = op(s, [item])[0]  # a Failure wrote nothing (BulkOp's contract)
        except Exception as exc:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
        return fut


class _Item:
    __slots__ = ("fn", "fut", "item", "op")

    def __init__(
        self,
        fut: Future[Any],
        *,
        fn: Callable[[Session], Any] | None = None,
        op: Any = None,
        item: Any = None,
    ) -> None:
        self.fut, self.fn, self.op, self.item = fut, fn, op, item


_Done = list[tuple["Future[Any]", Any, BaseException | None]]


class _Redo(Exception):
    """A bulk op raised: roll the batch back and redo it item by item."""


class GroupCommitWriter:
    def __init__(self, db: Database, *, max_batch: int = 256, max_wait_s: float = 0.002) -> None:
        self.db = db
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.idle_s = 1.0
        self.batches = 0
        self.items = 0
        self._conn: Connection | None = None
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-writer", daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[Session], T]) -> T:
        fut: Future[T] = Future()
        self._q.put(_Item(fut, fn=fn))
        return fut.result()

    def apply(self, op: BulkOp[P, R], item: P) -> Future[R]:
        fut: Future[R] = Future()
        self._q.put(_Item(fut, op=op, item=item))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)

    def _release(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _loop(self) -> None:
        last = 1
        while True:
            try:
                first = self._q.get(timeout=self.idle_s)
            except queue.Empty:
                self._release()  # idle: back to the pool, which checks it on the next use
                first = self._q.get()
            if first is None:
                self._release()
                return
            batch = self._gather(first, want=last)
            live = [it for it in batch if it.fut.set_running_or_notify_cancel()]
            last = len(batch)
            if live:
                self.batches += 1
                self.items += len(live)
                self._commit(live)

    def _gather(self, first: _Item, *, want: int) -> list[_Item]:
        """``first`` and whatever else is queued. Under load (the last batch had several
        items) wait up to ``max_wait_s`` for as many as last time: a fuller batch costs
        the same statements and the same fsync, so the CPU per write drops (at 8
        clients: ~4 -> ~7 items a batch). A lone request never waits."""
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            try:
                nxt = self._q.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if len(batch) >= want or left <= 0:
                    break
                try:
                    nxt = self._q.get(timeout=left)
                except queue.Empty:
                    break
            if nxt is None:
                self._q.put(None)
                break
            batch.append(nxt)
        return batch

    def _commit(self, batch: list[_Item]) -> None:
        try:
            try:
                done = self._transaction(batch, careful=False)
            except _Redo:
                done = self._transaction(batch, careful=True)
        except Exception as exc:  # the commit itself failed: nobody's work is durable
            log.warning("group commit of %d writes failed: %s", len(batch), exc)
            if self._conn is not None:
                self._conn.invalidate()
                self._conn = None
            for it in batch:
                it.fut.set_exception(exc)
            return
        for fut, result, error in done:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

    def _transaction(self, batch: list[_Item], *, careful: bool) -> _Done:
        if self._conn is None:
            self._conn = self.db.writer_connection()
        done: _Done = []
        with self._conn.begin(), Session(bind=self._conn, expire_on_commit=False) as s:
            bulk: dict[Any, list[_Item]] = {}
            for it in batch:
                if it.fn is not None or careful:
                    done.append(_alone(s, it))
                else:
                    bulk.setdefault(it.op, []).append(it)
            for op, items in bulk.items():
                try:
                    results = op(s, [it.item for it in items])
                except Exception as exc:
                    log.info("bulk write of %d items failed (%s); redoing them one by one", len(items), exc)
                    raise _Redo from exc
                done += [(it.fut, r, None) for it, r in zip(items, results, strict=True)]
            s.flush()
            marked = effects.take(s)
        if marked:  # committed: what the batch marked follows (``effects.py``)
            self.db.committed(marked)
        return done


def _alone(s: Session, it: _Item) -> tuple[Future[Any], Any, BaseException | None]:
    """One function, or one bulk item, in its own SAVEPOINT; rolled back, it takes its
    after-commit marks (``effects.py``) with it."""
    saved = effects.save(s)
    sp = s.begin_nested()
    try:
        result = it.fn(s) if it.fn is not None else it.op(s, [it.item])[0]
    except Exception as exc:
        sp.rollback()
        effects.restore(s, saved)
        return it.fut, None, exc
    if isinstance(result, Failure):
        sp.rollback()
        effects.restore(s, saved)
    else:
        sp.commit()
    return it.fut, result, None
