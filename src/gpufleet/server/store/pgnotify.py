"""Wake-ups and node touches between the servers of one PostgreSQL (``LISTEN``/``NOTIFY``).

Every server serves the API; the leader runs the loops (``leader.py``). What one server
learns must reach the others at once, not at their next poll:

- *wake*: a submit, a finished job or a service change on any server wakes the leader's
  scheduling loop (or its replica controller): ``wake("scheduling")``;
- *touch*: a commit that changed what some nodes should run (``dispatch.touch``: the
  leader placed a job, an API request cancelled one) rings those nodes' long-polls, which
  may wait on any server: ``touch(nodes)``;
- *observations* kept in memory (DESIGN.md's hot data): an agent's GPU readings
  (``telemetry``) and a gateway's traffic report (``traffic``) reach the other servers, so
  the leader's GPU health rules, energy accounting and autoscaler see every agent and
  gateway whichever server they talk to. Only a leader reads them (``wants_observations``).

One channel (``gpufleet``); a payload is ``<sender>|w|<loop>``, ``<sender>|t|<n1,n2,...>``
(a long list is sent in pieces under PostgreSQL's 8,000-byte payload limit),
``<sender>|m|<json>`` (a node's readings: ``{"n", "at", "g", "d", "c"}``) or
``<sender>|r|<json>`` (a gateway's report: ``{"gw", "at", "s"}``); readings too large for
one payload are not relayed (counted in ``dropped``). A server skips its own
notifications. Readings of one node waiting to be sent are replaced by newer ones.

Both directions are loops on the runner (``runner.Loop``), started and stopped with the
process's other loops (``loops/build.py``), so a failure is counted and logged as every
loop's and never ends them. *Sending* (``sender``, named ``notify``) is woken by each
wake, touch or reading, so a request never waits on it; it rests ``gap_s`` after a step
(``runner.Rest``), so a storm of wake-ups is one notification per ``gap_s``; a NOTIFY
the database refused is a failed step (what it carried is dropped; the loop rests a
second). *Listening* (``listener``, named ``listen``) holds a connection of its own;
its step waits up to ``LISTEN_WAIT_S`` on that socket for notifications, so it runs
with no interval; a failed step closes the connection and the next one, a second
later, opens a new one. Wake-ups and rings are a shortcut, never the only path: a
missed one costs what it cost before HA (the loop's interval, the agent's next sync); a
missed reading is replaced by the node's next one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from gpufleet.server.runner import Loop, Rest

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("gpufleet.notify")

CHANNEL = "gpufleet"
MAX_PAYLOAD = 7000
LISTEN_WAIT_S = 0.5
"""How long one listening step waits on its socket (and so at most how long a stop waits)."""
RETRY_S = 1.0
"""The rest after a failed step: a NOTIFY refused, a LISTEN connection lost."""


def conninfo(url: str) -> str:
    """A libpq URL for ``psycopg.connect`` from a SQLAlchemy one."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pieces(sender: str, nodes: set[str]) -> list[str]:
    """Touch payloads for ``nodes``, each under ``MAX_PAYLOAD`` bytes."""
    out: list[str] = []
    head = f"{sender}|t|"
    cur: list[str] = []
    size = len(head)
    for n in sorted(nodes):
        if cur and size + len(n) + 1 > MAX_PAYLOAD:
            out.append(head + ",".join(cur))
            cur, size = [], len(head)
        cur.append(n)
        size += len(n) + 1
    if cur:
        out.append(head + ",".join(cur))
    return out


def parse(payload: str, me: str) -> tuple[str, str] | None:
    """(kind, body) of another server's payload; None for ours or a garbled one."""
    sender, sep, rest = payload.partition("|")
    kind, sep2, body = rest.partition("|")
    if not sep or not sep2 or sender == me or kind not in ("w", "t", "m", "r"):
        return None
    return kind, body


def _dump(obj: Any) -> Any:
    """A pydantic model without its unset/None fields (a smaller payload), or ``obj``."""
    dump = getattr(obj, "model_dump", None)
    return obj if dump is None else dump(mode="json", exclude_none=True, exclude_defaults=True)


class PgNotify:
    """Both directions between the servers: ``send``/``touch``/readings queue what
    ``sender`` sends; ``listener`` delivers what the others sent to the ``on_*``
    callbacks. ``runners`` are the two loops, for the process's ``Loops``."""

    def __init__(
        self,
        engine: Engine,
        url: str,
        *,
        me: str,
        on_wake: Callable[[str], None],
        on_touch: Callable[[set[str]], None],
        on_telemetry: Callable[[dict[str, Any]], None] | None = None,
        on_traffic: Callable[[dict[str, Any]], None] | None = None,
        wants_observations: Callable[[], bool] = lambda: True,
        gap_s: float = 0.01,
    ) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.url = url
        self.me = me
        self.on_wake = on_wake
        self.on_touch = on_touch
        self.on_telemetry = on_telemetry
        self.on_traffic = on_traffic
        self.wants_observations = wants_observations
        self.gap_s = gap_s
        self.sent = 0
        self.received = 0
        self.dropped = 0
        self._wakes: set[str] = set()
        self._touched: set[str] = set()
        self._observed: dict[tuple[str, str], str] = {}  # (kind, node or gateway) -> payload
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None  # the listener's (its thread only)
        self.sender = Loop(
            name="notify",
            step=self.send_pending,
            interval_s=1.0,  # woken by what it sends; the interval only bounds a missed wake-up
            pacer=Rest(gap_s),
            retry_after_s=RETRY_S,
            expected=(SQLAlchemyError,),
        )
        self.listener = Loop(
            name="listen",
            step=self.listen_once,
            interval_s=0.0,  # the step itself waits, on the socket
            first_after_s=0.0,
            retry_after_s=RETRY_S,
            on_stop=self._disconnect,
            expected=(Exception,),  # a lost connection, a refused one: one line, then reconnect
        )

    # -- sending ------------------------------------------------------------------------------
    def wake(self, loop: str = "scheduling") -> None:
        with self._lock:
            self._wakes.add(loop)
        self.sender.wake()

    def touch(self, nodes: set[str]) -> None:
        if not nodes:
            return
        with self._lock:
            self._touched |= nodes
        self.sender.wake()

    def telemetry(
        self, node: str, at: float, gpus: Sequence[Any], driver: str | None, cuda: str | None
    ) -> None:
        body = json.dumps({"n": node, "at": at, "g": [_dump(g) for g in gpus], "d": driver, "c": cuda})
        self._observe("m", node, body)

    def traffic(self, gateway: str, at: float, services: Mapping[str, Any]) -> None:
        body = json.dumps({"gw": gateway, "at": at, "s": {k: _dump(v) for k, v in services.items()}})
        self._observe("r", gateway, body)

    def _observe(self, kind: str, key: str, body: str) -> None:
        payload = f"{self.me}|{kind}|{body}"
        if len(payload.encode()) > MAX_PAYLOAD:
            self.dropped += 1
            return
        with self._lock:
            self._observed[(kind, key)] = payload
        self.sender.wake()

    def send_pending(self) -> int:
        """The sender's step: everything queued since the last, as notifications on one
        connection; how many. Raises SQLAlchemyError when the database refused them."""
        with self._lock:
            wakes, self._wakes = self._wakes, set()
            touched, self._touched = self._touched, set()
            observed, self._observed = self._observed, {}
        payloads = [f"{self.me}|w|{w}" for w in sorted(wakes)] + pieces(self.me, touched)
        payloads += list(observed.values())
        if payloads:
            with self.engine.connect() as c:
                for p in payloads:
                    c.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": p})
            self.sent += len(payloads)
        return len(payloads)

    # -- listening ----------------------------------------------------------------------------
    def listen_once(self) -> None:
        """The listener's step: (re)connect and ``LISTEN`` if need be, then deliver what
        comes within ``LISTEN_WAIT_S``. A failure closes the connection (the next step
        opens another)."""
        import psycopg

        try:
            if self._conn is None:
                self._conn = psycopg.connect(conninfo(self.url), autocommit=True)
                self._conn.execute(f"LISTEN {CHANNEL}")
            for n in self._conn.notifies(timeout=LISTEN_WAIT_S):
                self._deliver(n.payload)
        except Exception:
            self._disconnect()
            raise

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _deliver(self, payload: str) -> None:
        got = parse(payload, self.me)
        if got is None:
            return
        self.received += 1
        kind, body = got
        try:
            if kind == "w":
                self.on_wake(body)
            elif kind == "t":
                self.on_touch({n for n in body.split(",") if n})
            elif self.wants_observations():
                handler = self.on_telemetry if kind == "m" else self.on_traffic
                if handler is not None:
                    handler(json.loads(body))
        except Exception:
            log.exception("handling a notification failed")

    # -- lifetime -----------------------------------------------------------------------------
    @property
    def runners(self) -> tuple[Loop, Loop]:
        """The two loops, in the order they start (they stop in reverse)."""
        return (self.sender, self.listener)
