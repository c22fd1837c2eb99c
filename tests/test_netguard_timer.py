"""The connection guard's one lazy timer (``netguard._Guard._g_arm``), on a real event
loop with a stand-in for uvicorn's httptools protocol (its callbacks are what the
guard reads): every deadline still holds when the timer is kept across requests
instead of set again for each.

- an answer that takes longer than every timeout does not close its connection (no
  deadline while the application answers), and the kept-alive deadline after it counts
  from the response's end;
- a head begun on a kept connection is held to the header timeout, not the keep-alive,
  counted from its first byte (nginx's ``client_header_timeout``): a client that idled
  longer than the header timeout may still send a head in pieces;
- after many requests in a row one timer is pending, and the connection closes at the
  last response's keep-alive deadline, not the first's;
- a connection that never sends anything closes at the idle timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.netguard import GuardLimits, GuardStats, guarded

LIMITS = GuardLimits(idle_timeout_s=0.3, header_timeout_s=0.3, keepalive_s=0.6, tick_s=0.05)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed_at: float | None = None
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("10.0.0.1", 1234) if name == "peername" else default

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed_at is not None

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = asyncio.get_running_loop().time()


class _Protocol:
    """What the guard needs of uvicorn's ``HttpToolsProtocol``: a whole request in one
    ``data_received`` runs the head and message callbacks; ``b"half"`` is part of a head."""

    transport: _Transport

    def connection_made(self, transport: _Transport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        if data == b"request":
            self.on_headers_complete()
            self.on_message_complete()

    def on_headers_complete(self) -> None:
        pass

    def on_message_complete(self) -> None:
        pass

    def on_response_complete(self) -> None:
        pass


def _connect(stats: GuardStats) -> tuple[Any, _Transport]:
    proto = guarded(_Protocol, LIMITS, stats)()
    transport = _Transport()
    proto.connection_made(transport)
    return proto, transport


def test_a_long_answer_keeps_its_connection_and_the_keepalive_counts_from_its_end() -> None:
    async def go() -> tuple[float | None, float, float | None, GuardStats]:
        stats = GuardStats()
        proto, transport = _connect(stats)
        proto.data_received(b"request")
        await asyncio.sleep(1.0)  # longer than every limit: the application is answering
        still_open = transport.closed_at
        proto.on_response_complete()
        answered = asyncio.get_running_loop().time()
        await asyncio.sleep(1.0)
        return still_open, answered, transport.closed_at, stats

    still_open, answered, closed_at, stats = asyncio.run(go())
    assert still_open is None
    assert closed_at is not None
    assert 0.55 <= closed_at - answered <= 0.8  # keep-alive 0.6 s, from the response's end
    assert stats.closed["idle"] == 1


def test_a_head_begun_on_a_kept_connection_has_the_header_timeout() -> None:
    async def go() -> tuple[float, float | None, GuardStats]:
        stats = GuardStats()
        proto, transport = _connect(stats)
        for _ in range(3):
            proto.data_received(b"request")
            proto.on_response_complete()
        await asyncio.sleep(0.45)  # kept longer than the header timeout, within the keep-alive
        begun = asyncio.get_running_loop().time()
        proto.data_received(b"half")
        await asyncio.sleep(0.8)
        return begun, transport.closed_at, stats

    begun, closed_at, stats = asyncio.run(go())
    assert closed_at is not None
    assert 0.25 <= closed_at - begun <= 0.45  # the header timeout (0.3 s), not the keep-alive (0.6 s)
    assert stats.closed["header"] == 1


def test_after_many_requests_the_deadline_is_the_last_responses() -> None:
    async def go() -> tuple[int, float, float, float | None]:
        stats = GuardStats()
        proto, transport = _connect(stats)
        loop = asyncio.get_running_loop()
        for _ in range(200):
            proto.data_received(b"request")
            proto.on_response_complete()
            await asyncio.sleep(0.002)
        last = loop.time()
        pending = sum(1 for h in getattr(loop, "_scheduled", []) if not h.cancelled())
        await asyncio.sleep(0.4)  # past the first timer's deadline, before the last request's
        open_then = transport.closed_at
        await asyncio.sleep(0.5)
        return pending, last, open_then if open_then is not None else -1.0, transport.closed_at

    pending, last, open_then, closed_at = asyncio.run(go())
    assert pending == 1
    assert open_then == -1.0  # the first timer fired, found a newer deadline, and waited
    assert closed_at is not None and 0.55 <= closed_at - last <= 0.8


def test_a_silent_connection_closes_at_the_idle_timeout() -> None:
    async def go() -> tuple[float, float | None, list[bytes]]:
        loop = asyncio.get_running_loop()
        opened = loop.time()
        _, transport = _connect(GuardStats())
        await asyncio.sleep(0.6)
        return opened, transport.closed_at, transport.written

    opened, closed_at, written = asyncio.run(go())
    assert closed_at is not None and 0.25 <= closed_at - opened <= 0.45
    assert written == []  # idle: closed without a 408
