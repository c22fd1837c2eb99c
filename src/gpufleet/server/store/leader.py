"""Several servers on one PostgreSQL: every server serves the API, one leader runs the loops.

Leadership is a lease in the database (``leader_lease``, one row) with a **fencing token**:
``epoch``, raised every time the holder changes. A lease alone is unsafe (a paused leader
wakes up believing it still leads: Kleppmann, "How to do distributed locking"; Jepsen on
etcd locks), so every write transaction of a leader's loop starts with the *fence*
(``PgFence``): ``UPDATE leader_lease ... WHERE holder = me AND epoch = mine``. It matches no
row once a newer leader exists, and the transaction is rolled back (``Fenced``) before it
wrote anything. Matched, it holds the lease row's lock until its commit: a server taking
over waits for that commit (or its ``lock_timeout``), so a write either commits under the
epoch it checked or not at all. A leader paused inside such a transaction (SIGSTOP) is cut
off by PostgreSQL's ``idle_in_transaction_session_timeout`` (set for fenced transactions),
which ends its session and releases the lock; its writes then never land. The lease's own
renewal is such a transaction too (it locks the lease row and the server's heartbeat row):
a leader paused between its statements would hold the lease row until it resumed, and no
server could take over (the likely cause of a three-server test failing under CI). It
is cut off after ``ttl_s`` idle (at least 1 s, at most ``IDLE_IN_TXN``).

``Lease`` is the SQL (the database's clock decides expiry, so servers' clocks may differ);
``Leadership`` is the keeper, a loop on the runner (``runner.Loop``, named ``leader``,
started and stopped with the process's other loops: ``loops/build.py``): it renews the
lease every ``ttl_s / 3``, starts a *term* (the server's loops, their writes fenced with
the term's epoch) when it gains the lease, and ends the term as soon as it learns of a
newer holder. A keeper that could not ask (no database, or the lease row locked past
``lock_timeout`` by one of its own fenced writes on a busy machine) learns nothing and
keeps its term (the look is a failure of its loop, counted): while the database does not
answer no loop can write either, and once another server leads, the fence refuses every
write of this term until the keeper's next look ends it. A keeper that was late (a pause,
a starved CPU) but renews under the same epoch keeps its term too: nobody led in between.
Restarting every loop on a busy machine would only make it busier.
``release`` (a clean stop) lets the next server take over at once instead of after ``ttl_s``.

SQLite stays single-server: ``SqliteLock`` holds an exclusive lock on a file beside the
database, and a second server on it refuses to start, naming the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gpufleet.server.errors import Fenced
from gpufleet.server.runner import Loop

log = logging.getLogger("gpufleet.leader")

EPOCH = "gpufleet.epoch"
"""``Session.info`` key: the epoch a fenced transaction checked (its job events carry it)."""
LEASE = "leader"
NOW = "EXTRACT(EPOCH FROM clock_timestamp())"
"""The database's clock, in seconds since the Unix epoch (PostgreSQL)."""
IDLE_IN_TXN_S = 5
IDLE_IN_TXN = f"{IDLE_IN_TXN_S}s"
"""How long a fenced transaction may sit idle before PostgreSQL ends its session (a
paused leader's): shorter than any lease TTL worth using."""


def server_id() -> str:
    """This process's name among the servers: host, pid and a random part (a restarted
    server is a new holder)."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The lease row as read: who leads, the epoch, and how long ago it was renewed."""

    holder: str
    epoch: int
    expires_in_s: float
    renewed_s_ago: float


class Lease:
    """The lease row's SQL (PostgreSQL). ``holder``: this server's id."""

    def __init__(
        self, engine: Engine, *, holder: str, ttl_s: float, url: str = "", version: str = ""
    ) -> None:
        self.engine = engine
        self.holder = holder
        self.ttl_s = ttl_s
        self.url = url
        self.version = version
        self.started_at = time.time()

    def acquire(self) -> int | None:
        """Take or renew the lease: the epoch held after this call, or None when another
        server holds an unexpired lease. Raises SQLAlchemyError when the database does not
        answer (or the row is locked past ``lock_timeout``: a fenced write in flight)."""
        with self.engine.begin() as c:
            return self.renew(c)

    def renew(self, c: Connection) -> int | None:
        """``acquire``'s statements in the caller's transaction ``c`` (tests hold one open
        to stand for a server paused inside its renewal)."""
        self._limits(c)
        c.execute(  # this server's heartbeat (``gpufleet status``); a server gone an hour is forgotten
            text(
                "INSERT INTO servers (id, url, version, started_at, last_seen) "
                f"VALUES (:me, :url, :v, :t0, {NOW}) ON CONFLICT (id) DO UPDATE SET last_seen = {NOW}"
            ),
            {"me": self.holder, "url": self.url[:512], "v": self.version[:64], "t0": self.started_at},
        )
        c.execute(text(f"DELETE FROM servers WHERE last_seen < {NOW} - 3600"))
        c.execute(
            text(
                "INSERT INTO leader_lease (name, holder, epoch, expires_at, renewed_at) "
                "VALUES (:name, '', 0, 0, 0) ON CONFLICT (name) DO NOTHING"
            ),
            {"name": LEASE},
        )
        row = c.execute(
            text(
                "UPDATE leader_lease SET "
                "epoch = CASE WHEN holder = :me THEN epoch ELSE epoch + 1 END, "
                f"holder = :me, expires_at = {NOW} + :ttl, renewed_at = {NOW} "
                f"WHERE name = :name AND (holder = :me OR expires_at < {NOW}) RETURNING epoch"
            ),
            {"me": self.holder, "ttl": self.ttl_s, "name": LEASE},
        ).first()
        if row is None:
            return None
        epoch = int(row[0])
        c.execute(
            text(
                f"INSERT INTO leader_terms (epoch, holder, acquired_at) VALUES (:e, :me, {NOW}) "
                "ON CONFLICT (epoch) DO NOTHING"
            ),
            {"e": epoch, "me": self.holder},
        )
        return epoch

    def _limits(self, c: Connection) -> None:
        """The lease transaction waits at most 2 s for the lease row, and is ended by
        PostgreSQL once idle for the TTL (1 s to ``IDLE_IN_TXN_S``): its holder paused."""
        idle_ms = int(1000 * min(max(self.ttl_s, 1.0), IDLE_IN_TXN_S))
        c.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {idle_ms}")
        c.exec_driver_sql("SET LOCAL lock_timeout = '2s'")

    def release(self, epoch: int) -> None:
        """Give the lease up now (a clean stop): the next server need not wait ``ttl_s``."""
        with self.engine.begin() as c:
            self._limits(c)
            c.execute(
                text(
                    "UPDATE leader_lease SET expires_at = 0 "
                    "WHERE name = :name AND holder = :me AND epoch = :e"
                ),
                {"name": LEASE, "me": self.holder, "e": epoch},
            )


def read_state(engine: Engine) -> LeaseState | None:
    """The lease row (None: no server ever led; SQLite has none)."""
    with engine.connect() as c:
        row = c.execute(
            text(
                f"SELECT holder, epoch, expires_at - {NOW}, {NOW} - renewed_at "
                "FROM leader_lease WHERE name = :n"
            ),
            {"n": LEASE},
        ).first()
    if row is None:
        return None
    return LeaseState(
        holder=str(row[0]), epoch=int(row[1]), expires_in_s=float(row[2]), renewed_s_ago=float(row[3])
    )


@dataclass(frozen=True, slots=True)
class PgFence:
    """The fence of one term: the first statement of each of its loops' write
    transactions (``Database.write``). Picklable as (holder, epoch) for the scheduling
    loop's child process."""

    holder: str
    epoch: int

    def __call__(self, s: Session) -> None:
        s.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_TXN}'"))
        res = s.execute(
            text(
                "UPDATE leader_lease SET renewed_at = renewed_at "
                "WHERE name = :n AND holder = :me AND epoch = :e"
            ),
            {"n": LEASE, "me": self.holder, "e": self.epoch},
        )
        if res.rowcount != 1:  # type: ignore[attr-defined]
            raise Fenced(f"epoch {self.epoch} is over: a newer leader exists; this write is refused")
        s.info[EPOCH] = self.epoch


class Term(Protocol):
    """What a leader runs while it leads (the loops); ``stop`` must not wait long."""

    def stop(self) -> None: ...


class Leadership:
    """The keeper (a ``runner.Runner``): renews the lease, starts a term on gaining it
    (``start_term(epoch)``), stops it on losing it. Its step is ``look``, every
    ``ttl_s / 3`` and at once on ``start``; a look the database does not answer is a
    failure of the loop (counted, one line logged) and the next comes one period later,
    as after any look."""

    name = "leader"

    def __init__(
        self,
        lease: Lease,
        *,
        start_term: Callable[[int], Term],
    ) -> None:
        self.lease = lease
        self.start_term = start_term
        self.term: Term | None = None
        self.epoch: int | None = None
        self.changes = 0
        self._lock = threading.Lock()
        self.loop = Loop(
            name=self.name,
            step=self.look,
            interval_s=self.period_s,
            first_after_s=0.0,
            retry_after_s=0.0,  # a failed look waits one period, as any: a lease must not lapse
            expected=(SQLAlchemyError,),
        )

    @property
    def leading(self) -> bool:
        return self.term is not None

    @property
    def period_s(self) -> float:
        return self.lease.ttl_s / 3

    @property
    def passes(self) -> int:
        return self.loop.passes

    @property
    def failures(self) -> int:
        """Looks that failed: the database did not answer (or the lease row was busy with a
        fenced write of ours past ``lock_timeout``), or starting a term raised."""
        return self.loop.failures

    def look(self) -> None:
        """One renewal: the keeper's step (tests call it directly). Raises
        SQLAlchemyError when the database does not answer: nothing was learnt, the term
        goes on (the fence refuses its writes if the lease moved)."""
        with self._lock:
            epoch = self.lease.acquire()
            if epoch is None:
                if self.term is not None:
                    self._end("another server holds the lease")
                self.epoch = None
                return
            if self.term is not None and self.epoch == epoch:
                return
            if self.term is not None:
                self._end(f"the lease moved to epoch {epoch}")
            self.epoch = epoch
            self.changes += 1
            log.warning("leader: this server leads now (epoch %d); starting the loops", epoch)
            self.term = self.start_term(epoch)

    def _end(self, why: str) -> None:
        term, self.term = self.term, None
        log.warning("leader: epoch %s is over here: %s; stopping the loops", self.epoch, why)
        if term is not None:
            try:
                term.stop()
            except Exception:
                log.exception("stopping the loops failed")

    def start(self) -> None:
        self.loop.start()

    def wake(self) -> None:
        """Look now (not only at the next period)."""
        self.loop.wake()

    def stop(self) -> None:
        """End the term and give the lease up (the next server takes over at once)."""
        self.loop.stop()
        with self._lock:
            epoch = self.epoch if self.term is not None else None
            if self.term is not None:
                self._end("the server is stopping")
            if epoch is not None:
                with contextlib.suppress(SQLAlchemyError):
                    self.lease.release(epoch)


class SqliteLock:
    """SQLite is single-server: an exclusive ``flock`` on ``<database>.server-lock`` for
    the server's lifetime. The lock goes with the process (SIGKILL included)."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".server-lock")
        self._file: IO[str] | None = None

    def acquire(self) -> str | None:
        """None when taken; else why not (another server serves this database)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            who = f.read().strip() or "another process"
            f.close()
            db = self.path.name[: -len(".server-lock")]
            return (
                f"another gpufleet server ({who}) serves the SQLite database {db}: "
                "SQLite is for one server; several servers share a PostgreSQL database "
                "(README, Production)"
            )
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        self._file = f
        return None

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def servers(engine: Engine, ttl_s: float) -> dict[str, Any]:
    """The servers and the lease, for ``GET /v1/fleet/servers`` (``gpufleet status``): a
    server is up when it renewed its heartbeat within ``ttl_s`` (it does every ttl/3)."""
    state = read_state(engine)
    with engine.connect() as c:
        rows = c.execute(
            text(
                f"SELECT id, url, version, started_at, {NOW} - last_seen FROM servers ORDER BY started_at, id"
            )
        ).all()
    leading = state is not None and state.expires_in_s > 0 and bool(state.holder)
    return {
        "leader": state.holder if leading and state is not None else None,
        "epoch": state.epoch if state is not None else 0,
        "lease_age_s": None if state is None else round(max(0.0, state.renewed_s_ago), 3),
        "lease_expires_in_s": None if state is None else round(state.expires_in_s, 3),
        "servers": [
            {
                "id": str(r[0]),
                "url": str(r[1]),
                "version": str(r[2]),
                "started_at": float(r[3]),
                "seen_s_ago": round(max(0.0, float(r[4])), 3),
                "up": float(r[4]) <= ttl_s,
                "leader": leading and state is not None and str(r[0]) == state.holder,
            }
            for r in rows
        ],
    }
