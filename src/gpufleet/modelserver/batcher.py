"""Triton's dynamic batcher for one model: concurrent requests run as one forward call
on their concatenated rows.

Why: a GPU (here :class:`~gpufleet.modelserver.model.SimulatedDevice`) pays a fixed cost
per call and little per row, so at load a server that runs requests one by one spends
its time on that fixed cost; run together, the requests share it.

How, as Triton does with one model instance (``instance_group`` count 1): one task per
model takes requests from the queue in arrival order and runs one execution at a time
in a thread of its own (the event loop keeps reading requests meanwhile). With batching
on it gathers rows until the largest preferred size it can fill is reached, or until
the oldest request has waited ``max_queue_delay``, whichever comes first; never more
than ``max_batch_size`` rows, and a request's rows are never split. Requests that arrive
while an execution runs wait for it and then leave at once in the next batch (their
delay has usually passed). Without preferred sizes, ``max_batch_size`` is the one
preferred size.

One difference from Triton: here a delay of 0 turns batching off (each request runs
alone), where Triton's ``dynamic_batching {}`` with delay 0 still batches the requests
that queued while the instance was busy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpufleet.modelserver.model import MAX_BATCH

log = logging.getLogger(__name__)

Forward = Callable[[NDArray[Any]], NDArray[Any]]
"""The model: rows in, one output row per input row."""


@dataclass(frozen=True, kw_only=True)
class BatchPolicy:
    """Triton's ``max_batch_size`` and ``dynamic_batching`` settings."""

    max_batch_size: int = MAX_BATCH
    max_queue_delay_us: int = 0
    """0: batching off, each request runs alone."""
    preferred_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max batch size must be at least 1, got {self.max_batch_size}")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max queue delay must not be negative, got {self.max_queue_delay_us}")
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(f"preferred batch size {size} is not within 1..{self.max_batch_size}")

    @property
    def enabled(self) -> bool:
        return self.max_queue_delay_us > 0

    @property
    def targets(self) -> tuple[int, ...]:
        """The sizes that end the wait for more rows, smallest first."""
        return tuple(sorted(set(self.preferred_batch_sizes) or {self.max_batch_size}))

    def as_triton_config(self) -> dict[str, Any] | None:
        """The model config's ``dynamic_batching`` section, None when off."""
        if not self.enabled:
            return None
        return {
            "preferred_batch_size": list(self.targets),
            "max_queue_delay_microseconds": self.max_queue_delay_us,
        }


@dataclass(frozen=True, kw_only=True)
class Execution:
    """One forward call, as the statistics count it (times in ns)."""

    rows: int
    requests: int
    input_ns: int
    infer_ns: int
    output_ns: int
    ok: bool


@dataclass(frozen=True, kw_only=True)
class Result:
    """What one request gets back: its own output rows and where its time went."""

    output: NDArray[Any]
    queue_ns: int
    execution: Execution


@dataclass(slots=True, eq=False)
class _Queued:
    x: NDArray[Any]
    rows: int
    arrived_ns: int
    future: asyncio.Future[Result]


class Batcher:
    """The queue and execution task of one model; ``on_execution`` sees every forward
    call (on the event loop) so statistics need no lock."""

    def __init__(
        self,
        *,
        forward: Forward,
        policy: BatchPolicy,
        on_execution: Callable[[Execution], None] = lambda _: None,
        name: str = "model",
    ) -> None:
        self.forward = forward
        self.policy = policy
        self.on_execution = on_execution
        self._targets = policy.targets
        self._delay_ns = policy.max_queue_delay_us * 1000
        self._queue: deque[_Queued] = deque()
        self._queued_rows = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-instance")

    async def infer(self, x: NDArray[Any]) -> Result:
        """Queue ``x`` (checked rows, at most ``max_batch_size``) and wait for its rows
        of the batch it ran in; raises what the forward call raised."""
        if len(x) > self.policy.max_batch_size:
            raise ValueError(f"{len(x)} rows exceed max_batch_size {self.policy.max_batch_size}")
        loop = asyncio.get_running_loop()
        if self._task is None:  # started on first use: it must run on the server's loop
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="batcher")
        item = _Queued(x=x, rows=len(x), arrived_ns=time.perf_counter_ns(), future=loop.create_future())
        self._queue.append(item)
        self._queued_rows += item.rows
        assert self._wake is not None
        self._wake.set()
        return await item.future

    async def close(self) -> None:
        """Stop the task; requests still queued fail."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(RuntimeError("the model server is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the task --------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.policy.enabled:
                await self._gather()
            batch = self._take()
            await self._execute(batch)

    async def _gather(self) -> None:
        """Wait until a preferred size can be filled or the oldest request's delay is over."""
        assert self._wake is not None
        deadline_ns = self._queue[0].arrived_ns + self._delay_ns
        while self._queued_rows < self._targets[0]:
            left_s = (deadline_ns - time.perf_counter_ns()) / 1e9
            if left_s <= 0:
                return
            self._wake.clear()
            try:
                async with asyncio.timeout(left_s):
                    await self._wake.wait()
            except TimeoutError:
                pass  # the loop's timers may fire a little early: the check above decides

    def _take(self) -> list[_Queued]:
        """The next batch from the head of the queue: one request when batching is off;
        else the requests that fit the largest preferred size the queue fills, or when
        it fills none (the delay is over), all that fit ``max_batch_size``."""
        if not self.policy.enabled:
            size = 0
        else:
            filled = [t for t in self._targets if t <= self._queued_rows]
            size = filled[-1] if filled else self.policy.max_batch_size
        batch = [self._queue.popleft()]
        rows = batch[0].rows
        while self._queue and rows + self._queue[0].rows <= size:
            item = self._queue.popleft()
            batch.append(item)
            rows += item.rows
        self._queued_rows -= rows
        return batch

    async def _execute(self, batch: list[_Queued]) -> None:
        started_ns = time.perf_counter_ns()
        xs = [item.x for item in batch]
        loop = asyncio.get_running_loop()
        try:
            outputs, execution = await loop.run_in_executor(self._executor, self._compute, xs)
        except Exception as exc:  # the model failed: every request of the batch fails with it
            rows = sum(item.rows for item in batch)
            failed = Execution(rows=rows, requests=len(batch), input_ns=0, infer_ns=0, output_ns=0, ok=False)
            self._report(failed)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        self._report(execution)
        for item, output in zip(batch, outputs, strict=True):
            if not item.future.done():  # its client may have gone
                item.future.set_result(
                    Result(output=output, queue_ns=started_ns - item.arrived_ns, execution=execution)
                )

    def _report(self, execution: Execution) -> None:
        try:
            self.on_execution(execution)
        except Exception:  # statistics must not stop the model
            log.exception("on_execution failed")

    def _compute(self, xs: list[NDArray[Any]]) -> tuple[list[NDArray[Any]], Execution]:
        """In the instance's thread: concatenate, run, split."""
        t0 = time.perf_counter_ns()
        x = xs[0] if len(xs) == 1 else np.concatenate(xs)
        t1 = time.perf_counter_ns()
        y = self.forward(x)
        t2 = time.perf_counter_ns()
        cuts = np.cumsum([len(part) for part in xs[:-1]]).tolist()
        outputs = np.split(y, cuts) if cuts else [y]
        t3 = time.perf_counter_ns()
        execution = Execution(
            rows=len(x), requests=len(xs), input_ns=t1 - t0, infer_ns=t2 - t1, output_ns=t3 - t2, ok=True
        )
        return outputs, execution


__all__ = ["BatchPolicy", "Batcher", "Execution", "Forward", "Result"]
