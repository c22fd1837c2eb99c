"""The text model's decoding engine: continuous batching (as vLLM does it) or static
batching, for the OpenAI-compatible endpoints.

Why: a GPU decodes one token of every sequence in a batch in one step, and a step costs
almost the same whatever the batch's size (the weights are read once per step, not once
per sequence). Serving is then a question of keeping the batch full.

* **continuous** (default; vLLM, TGI, TensorRT-LLM's "in-flight batching"): the batch is
  re-formed at every step. A sequence that has finished (its ``max_tokens``, or a stop
  string) leaves after the step that finished it, and its client has its answer at once;
  waiting sequences join, oldest first, as long as fewer than ``max_num_seqs`` run.
* **static** (the baseline: HF ``generate`` on a batch, FasterTransformer before
  in-flight batching): when the engine is idle, the waiting sequences (up to
  ``max_num_seqs``) form a batch, which runs until its longest sequence ends; nothing
  joins meanwhile, so a short request that arrives waits for the batch's longest one. A
  sequence that finishes early is still answered at its own last token, and its row no
  longer counts in the step's cost: the kindest form of static batching (padded
  implementations pay for the finished rows too), so that what continuous batching
  gains over it is its scheduling alone.

The simulated step cost is the same for both: ``step_s + step_per_seq_s * batch``
(``EnginePolicy.step_cost_s``): a fixed cost per step (``--token-delay-ms``: kernel
launches and reading the weights) and a small one per sequence in it
(``--token-delay-per-seq-us``: its share of attention and sampling). Steps keep their
pace on a step clock: each aims at the end of the last one plus its cost, not at "now
plus its cost", because the event loop's timers fire up to a millisecond late and that
would add up over hundreds of steps; after a stall of more than ``MAX_LAG_S`` the clock
starts again from now rather than rush to catch up.

A request's choices (``n`` times its prompts) are sequences of their own that are
scheduled one by one, as vLLM v1 fans ``n`` out into child requests; the request is
answered once every one of its sequences has finished. The engine runs on the server's
event loop (the toy's token costs a hash; only the step's time is simulated, as a
sleep), so no lock is needed. Sequences wait in a bounded queue (``max_waiting``, not
counting those that free slots take at the next step): ``submit`` raises ``EngineFull``
beyond it, which the endpoint answers 503 with ``Retry-After: 1`` (a constant, not an
estimate of when a slot frees). ``cancel`` takes a request's sequences out: at once from the queue, from
the batch before the next step (a client that disconnects frees its slot).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

from gpufleet.modelserver.textgen import Decoder, Generation

log = logging.getLogger(__name__)

Mode = Literal["continuous", "static"]
MODES: tuple[Mode, ...] = ("continuous", "static")
MAX_NUM_SEQS = 64
"""The default most sequences decoded in one step (``--max-num-seqs``, vLLM's name)."""
MAX_WAITING = 1024
"""The default most sequences waiting for a slot (``--max-waiting``) before a 503."""
MAX_LAG_S = 0.05
"""How far the step clock may fall behind the real one before it restarts from now."""


@dataclass(frozen=True, kw_only=True)
class EnginePolicy:
    """How the engine batches, and what a step costs (see the module's docstring)."""

    mode: Mode = "continuous"
    max_num_seqs: int = MAX_NUM_SEQS
    max_waiting: int = MAX_WAITING
    step_s: float = 0.0
    step_per_seq_s: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"batching must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max num seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_waiting < 1:
            raise ValueError(f"max waiting must be at least 1, got {self.max_waiting}")
        if self.step_s < 0 or self.step_per_seq_s < 0:
            raise ValueError("a step's cost must not be negative")

    def step_cost_s(self, seqs: int) -> float:
        """The simulated time of one decoding step over ``seqs`` sequences."""
        return self.step_s + self.step_per_seq_s * seqs


class EngineFull(Exception):
    """The queue of waiting sequences is full: answer 503 and come back later."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Update:
    """What one step did to one choice: ``piece`` of text it added (None: none),
    ``finish_reason`` when the choice ended with it."""

    index: int
    piece: str | None
    finish_reason: str | None


class Sequence:
    """One choice of a request, in the queue or in the batch."""

    __slots__ = ("decoder", "group", "index")

    def __init__(self, decoder: Decoder, group: Group, index: int) -> None:
        self.decoder = decoder
        self.group = group
        self.index = index


class Group:
    """One request's sequences and what the engine has made of them since the reader
    last looked (``updates``); the request's end is ``wait``."""

    def __init__(self, decoders: list[Decoder]) -> None:
        self.decoders = decoders
        self.seqs = [Sequence(d, self, i) for i, d in enumerate(decoders)]
        self.unfinished = sum(1 for d in decoders if d.finish_reason is None)
        self.cancelled = False
        self.error: BaseException | None = None
        self._news = [Update(i, None, d.finish_reason) for i, d in enumerate(decoders) if d.finish_reason]
        self._changed = asyncio.Event()
        if self.finished:
            self._changed.set()

    @property
    def finished(self) -> bool:
        return self.unfinished == 0

    def generations(self) -> list[Generation]:
        """Every choice's generation, once finished."""
        return [d.generation() for d in self.decoders]

    async def wait(self) -> list[Generation]:
        """Until every choice has finished; raises what stopped the engine."""
        while not self.finished:
            if self.error is not None:
                raise self.error
            self._changed.clear()
            await self._changed.wait()
        return self.generations()

    async def updates(self) -> AsyncIterator[list[Update]]:
        """What each step added, as it comes (several steps' worth when the reader was
        slower), until every choice has finished; raises what stopped the engine."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.error is not None:
                raise self.error
            news, self._news = self._news, []
            if news:
                yield news
            if self.finished:
                return

    def _add(self, update: Update) -> None:
        self._news.append(update)
        self._changed.set()

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self._changed.set()


class TextEngine:
    """The batch and its queue; one per served text model. Started on first use (it must
    run on the server's loop). ``on_step`` sees every step (tokens decoded, its simulated
    seconds), for the statistics."""

    def __init__(
        self, policy: EnginePolicy | None = None, *, on_step: Callable[[int, float], None] = lambda n, s: None
    ) -> None:
        self.policy = policy or EnginePolicy()
        self.on_step = on_step
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()
        self.steps = 0
        """Decoding steps run (a test can see joins happen between them)."""
        self.tokens = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def submit(self, decoders: list[Decoder]) -> Group:
        """Queue a request's choices; raises EngineFull when the queue cannot take them
        (ValueError when it never could: more choices than slots and queue together)."""
        policy = self.policy
        most = policy.max_waiting + policy.max_num_seqs
        if len(decoders) > most:
            raise ValueError(f"{len(decoders)} choices exceed what this server takes at once ({most})")
        if len(self.waiting) + len(decoders) > policy.max_waiting + self._free_slots():
            raise EngineFull(
                f"the model's queue is full ({len(self.waiting)} sequences wait for one of"
                f" {policy.max_num_seqs} slots); retry later",
                retry_after_s=1,
            )
        group = Group(decoders)
        self.waiting.extend(seq for seq in group.seqs if seq.decoder.finish_reason is None)
        if not group.finished:
            if self._task is None:
                self._wake = asyncio.Event()
                self._task = asyncio.get_running_loop().create_task(self._run(), name="text-engine")
            assert self._wake is not None
            self._wake.set()
        return group

    def _free_slots(self) -> int:
        """Slots the next step fills from the queue: what waits for them is not queued
        behind anything (requests that arrive together, before the engine's next look,
        do not count against ``max_waiting`` while slots are free)."""
        if self.policy.mode == "static" and self.running:
            return 0
        return max(0, self.policy.max_num_seqs - len(self.running))

    def cancel(self, group: Group) -> None:
        """Take ``group``'s sequences out (its client left): at once from the queue, from
        the batch before the next step. Nothing when it has finished."""
        if group.finished or group.cancelled:
            return
        group.cancelled = True
        if any(seq.group is group for seq in self.waiting):
            self.waiting = deque(seq for seq in self.waiting if seq.group is not group)

    async def close(self) -> None:
        """Stop the engine; every request not finished fails."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        error = RuntimeError("the model server is shutting down")
        for seq in [*self.running, *self.waiting]:
            seq.group._fail(error)
        self.running.clear()
        self.waiting.clear()

    # -- the task --------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        clock = loop.time()  # when the last step ended, on the step clock
        while True:
            idle = not self.running
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            if idle or now - clock > MAX_LAG_S:
                clock = now
            cost = self.policy.step_cost_s(len(self.running))
            clock += cost
            await asyncio.sleep(max(0.0, clock - loop.time()))  # 0: still let the loop serve
            try:
                decoded = self._step()
            except Exception as exc:  # a bug in a decoder must not leave its clients hanging
                log.exception("decoding step failed")
                for seq in self.running:
                    seq.group._fail(exc)
                self.running.clear()
                continue
            try:
                self.on_step(decoded, cost)
            except Exception:  # statistics must not stop the model
                log.exception("on_step failed")

    def _admit(self) -> None:
        """Drop cancelled sequences, then let waiting ones join: continuous, up to
        ``max_num_seqs`` at every step; static, only into an empty batch."""
        if any(seq.group.cancelled for seq in self.running):
            self.running = [seq for seq in self.running if not seq.group.cancelled]
        if self.policy.mode == "static" and self.running:
            return
        while self.waiting and len(self.running) < self.policy.max_num_seqs:
            seq = self.waiting.popleft()
            if not seq.group.cancelled:
                self.running.append(seq)

    def _step(self) -> int:
        """One token for every sequence in the batch; finished ones leave it. Returns
        the tokens decoded."""
        self.steps += 1
        before = self.tokens
        still: list[Sequence] = []
        for seq in self.running:
            group = seq.group
            if group.cancelled:  # cancelled while the step ran: its token goes nowhere
                continue
            piece = seq.decoder.step()
            finish = seq.decoder.finish_reason
            self.tokens += 1
            if finish is None:
                still.append(seq)
            else:
                group.unfinished -= 1
            group._add(Update(seq.index, piece, finish))
        self.running = still
        return self.tokens - before


__all__ = [
    "MAX_NUM_SEQS",
    "MAX_WAITING",
    "MODES",
    "EngineFull",
    "EnginePolicy",
    "Group",
    "Mode",
    "Sequence",
    "TextEngine",
    "Update",
]
