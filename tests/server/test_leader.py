"""Several servers on one PostgreSQL (``gpufleet.server.store.leader``): one leader, fenced writes.

On a PostgreSQL database of their own (skipped without one):

- the lease's SQL: one holder at a time, renewal keeps the epoch, expiry or a release lets
  another take it with the next epoch, every term recorded;
- the fence: a write under an old epoch is refused and leaves nothing; a takeover waits for
  a fenced write in flight, so that write lands before the new epoch begins;
- real server processes: every server answers, one leads; SIGKILL the leader and another
  takes over; SIGSTOP the next leader past its lease and resume it: it stops its loops and
  writes nothing after the new epoch began (job events carry their leader's epoch and never
  go back), every job submitted through any server is placed once, on GPUs no other job
  holds, and a GPU reading that reached a follower fires the leader's health rule.

SQLite stays single-server: a second server on the same file refuses to start.

The keeper on the runner (no database: a scripted lease): a look the database does not
answer is a counted failure of the ``leader`` loop that keeps the term; the process's
loops (``loops/build.process``) start NOTIFY, LISTEN and the keeper in order and stop
them in reverse, so the term ends and the lease is given up while NOTIFY still runs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from gpufleet.server.errors import Fenced
from gpufleet.server.loops import build
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.leader import EPOCH, Leadership, Lease, PgFence
from gpufleet.server.store.pgnotify import PgNotify
from server.conftest import ADMIN_TOKEN, Server, ok, scratch_postgres, start_server, stop_server


def _terms(url: str) -> list[tuple[int, str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return [
                (int(e), str(h))
                for e, h in c.execute(text("SELECT epoch, holder FROM leader_terms ORDER BY epoch"))
            ]
    finally:
        engine.dispose()


@contextlib.contextmanager
def _database(label: str) -> Iterator[tuple[str, dbmod.Database]]:
    """A PostgreSQL database of its own at the schema, and a ``Database`` on it."""
    with scratch_postgres(label) as url:
        dbmod.upgrade(url)
        db = dbmod.Database.connect(url)
        try:
            yield url, db
        finally:
            db.dispose()


def test_the_lease_has_one_holder_and_the_fence_refuses_old_epochs() -> None:
    with _database("lease") as (url, db):
        a, b = (Lease(db.engine, holder=h, ttl_s=1.0) for h in ("a", "b"))
        first = a.acquire()
        assert first == 1 and b.acquire() is None
        assert a.acquire() == first  # a renewal keeps the epoch
        with db.fenced(PgFence("a", first)).write() as s:
            assert s.info[EPOCH] == first
        time.sleep(1.2)  # a's lease expires: b takes it with the next epoch
        second = b.acquire()
        assert second == first + 1
        with pytest.raises(Fenced), db.fenced(PgFence("a", first)).write() as s:
            s.execute(text("INSERT INTO servers (id, started_at, last_seen) VALUES ('stale', 0, 0)"))
        with db.read() as s:  # refused before anything was written
            assert s.execute(text("SELECT count(*) FROM servers WHERE id = 'stale'")).scalar_one() == 0
        assert a.acquire() is None
        b.release(second)  # a clean stop: the next holder need not wait for the expiry
        assert a.acquire() == second + 1
        assert _terms(url) == [(1, "a"), (2, "b"), (3, "a")]


def test_a_takeover_waits_for_the_fenced_write_in_flight() -> None:
    with _database("fence") as (_, db):
        a, b = (Lease(db.engine, holder=h, ttl_s=0.5) for h in ("a", "b"))
        epoch = a.acquire()
        assert epoch is not None
        inside = threading.Event()
        done: list[float] = []

        def slow_write() -> None:
            with db.fenced(PgFence("a", epoch)).write() as s:
                inside.set()
                time.sleep(1.0)  # the lease expires meanwhile
                s.execute(text("INSERT INTO servers (id, started_at, last_seen) VALUES ('late', 0, 0)"))
            done.append(time.monotonic())

        t = threading.Thread(target=slow_write)
        t.start()
        assert inside.wait(5)
        time.sleep(0.6)
        assert b.acquire() == epoch + 1  # blocked on the lease row until a's commit
        took = time.monotonic()
        t.join()
        assert done and done[0] <= took  # a's write landed under its epoch, before b's


def test_a_leader_paused_inside_its_renewal_does_not_keep_the_lease() -> None:
    """SIGSTOP between the renewal's statements (here: the renewal run in a transaction
    the test keeps open) left the lease row locked until the holder resumed, and no
    server could take over. PostgreSQL ends that idle transaction after the TTL."""
    with _database("pausedrenewal") as (_, db):
        a, b = (Lease(db.engine, holder=h, ttl_s=1.0) for h in ("a", "b"))
        first = a.acquire()
        assert first == 1
        with db.engine.connect() as paused:
            tx = paused.begin()
            assert a.renew(paused) == first  # a renews, then stops before its commit
            t0 = time.monotonic()
            took = None
            while took is None and time.monotonic() - t0 < 15:
                with contextlib.suppress(OperationalError):  # the lease row is locked: lock_timeout
                    took = b.acquire()
                time.sleep(0.1)
            waited = time.monotonic() - t0
            with pytest.raises(DBAPIError):  # a's session was ended: nothing of it lands
                tx.commit()
        assert took == first + 1, took
        assert waited < 5, waited  # the TTL and the idle limit (1 s each), not forever


def test_a_second_server_on_one_sqlite_file_refuses_to_start(tmp_path: Path) -> None:
    """A first server holds the file's lock (here a process that takes it as the server
    does, ``leader.SqliteLock``): ``gpufleet server`` on the same file refuses before it
    touches the database, naming the holder and PostgreSQL."""
    db = tmp_path / "one.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [sys.executable, "-m", "gpufleet", "server", "--port", "1", "--database-url", f"sqlite:///{db}"],
            env={**os.environ, "GPUFLEET_ADMIN_TOKEN": ADMIN_TOKEN},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode != 0
        assert f"another gpufleet server (pid {holder.pid}" in second.stderr, second.stderr
        assert "PostgreSQL" in second.stderr and not db.exists()  # refused before touching it
    finally:
        holder.kill()
        holder.wait()


HOLD = """
import sys, time
from pathlib import Path
from gpufleet.server.store.leader import SqliteLock
lock = SqliteLock(Path(sys.argv[1]))  # held while the object lives
assert lock.acquire() is None
print("held", flush=True)
time.sleep(60)
"""


def test_one_sqlite_server_says_it_is_alone(server: Server) -> None:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the single-server answer is SQLite's")
    status = _status(server)
    assert status["mode"] == "single" and status["leader"] == status["me"] and len(status["servers"]) == 1


# -- the keeper on the runner (a scripted lease, no database) ----------------------------------

NO_ANSWER = OperationalError("SELECT", {}, Exception("connection refused"))


class ScriptedLease:
    """A lease whose ``acquire`` answers from a script (an epoch, None: another server
    holds it, or an exception: the database did not answer); the last answer repeats."""

    def __init__(self, *answers: int | Exception | None, ttl_s: float = 3.0) -> None:
        self.answers = list(answers)
        self.ttl_s = ttl_s
        self.released: list[int] = []

    def acquire(self) -> int | None:
        got = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(got, Exception):
            raise got
        return got

    def release(self, epoch: int) -> None:
        self.released.append(epoch)


class Terms:
    """Records the terms the keeper starts and stops; ``on_stop`` runs as one stops."""

    def __init__(self, on_stop: Any = None) -> None:
        self.log: list[str] = []
        self.on_stop = on_stop

    def __call__(self, epoch: int) -> Terms:
        self.log.append(f"start {epoch}")
        self.epoch = epoch
        return self

    def stop(self) -> None:
        self.log.append(f"stop {self.epoch}")
        if self.on_stop is not None:
            self.on_stop()


@pytest.mark.parametrize(
    ("answers", "want_log", "want_leading", "want_failures"),
    [
        ([1, NO_ANSWER, 1], ["start 1"], True, 1),
        ([NO_ANSWER, NO_ANSWER, 2], ["start 2"], True, 2),
        ([1, 1, None], ["start 1", "stop 1"], False, 0),
        ([1, NO_ANSWER, 2], ["start 1", "stop 1", "start 2"], True, 1),
    ],
    ids=["no-answer-keeps-the-term", "no-answer-then-lead", "another-holds-it", "the-epoch-moved"],
)
def test_a_look_without_an_answer_is_a_counted_failure_that_keeps_the_term(
    answers: list[int | Exception | None], want_log: list[str], want_leading: bool, want_failures: int
) -> None:
    terms = Terms()
    keeper = Leadership(ScriptedLease(*answers), start_term=terms)  # type: ignore[arg-type]
    ran = [keeper.loop.run_once() for _ in answers]  # the loop's step, as its thread runs it
    assert terms.log == want_log and keeper.leading == want_leading
    assert keeper.failures == want_failures and ran.count(False) == want_failures
    assert keeper.passes == len(answers) - want_failures


def test_the_process_loops_stop_the_keeper_first_and_it_gives_the_lease_up() -> None:
    notify = PgNotify(
        create_engine("sqlite://"),  # NOTIFY fails here: counted, never fatal
        "postgresql://nobody@127.0.0.1:1/none",  # LISTEN cannot connect: counted, retried
        me="a",
        on_wake=print,
        on_touch=print,
    )
    notify.listener.retry_after_s = 0.01
    alive_at_term_end: list[bool] = []
    terms = Terms(on_stop=lambda: alive_at_term_end.extend(t.is_alive() for t in _threads(notify)))
    keeper = Leadership(ScriptedLease(NO_ANSWER, 7, ttl_s=0.03), start_term=terms)  # type: ignore[arg-type]
    loops = build.process(notify, keeper)
    assert [r.name for r in loops.runners] == ["notify", "listen", "leader"]
    loops.start()
    try:
        notify.wake("scheduling")
        deadline = time.monotonic() + 5
        while not (keeper.leading and notify.listener.failures >= 2 and notify.sender.failures >= 1):
            assert time.monotonic() < deadline, (keeper.leading, notify.listener.failures)
            time.sleep(0.01)
        assert keeper.failures == 1 and keeper.passes >= 1  # the first look had no answer
    finally:
        loops.stop()
    assert terms.log == ["start 7", "stop 7"] and keeper.lease.released == [7]  # type: ignore[attr-defined]
    assert alive_at_term_end == [True, True]  # NOTIFY and LISTEN still ran as the term ended
    assert not any(t.is_alive() for t in _threads(notify)) and notify.listener.passes == 0


def _threads(notify: PgNotify) -> list[threading.Thread]:
    return [t for t in (notify.sender._thread, notify.listener._thread) if t is not None]


# -- three real servers -------------------------------------------------------------------------


def _status(srv: Server) -> dict[str, Any]:
    with httpx.Client(
        base_url=srv.url + "/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=3
    ) as c:
        return ok(c.get("/fleet/servers"))  # type: ignore[no-any-return]


def _leader(ask: list[Server], *, not_in: set[str] = frozenset(), timeout: float = 15.0) -> dict[str, Any]:
    """The servers' status once one of ``ask`` names a leader that is none of ``not_in``."""
    deadline = time.monotonic() + timeout
    while True:
        for srv in ask:
            try:
                st = _status(srv)
            except httpx.HTTPError:
                continue
            if st["leader"] is not None and st["leader"] not in not_in:
                return st
        assert time.monotonic() < deadline, "no new leader"
        time.sleep(0.1)


def test_servers_share_the_work_and_a_stale_leader_writes_nothing() -> None:
    with scratch_postgres("ha") as url:
        args = ("--leader-ttl", "1s", "--scheduler-thread")
        servers = [start_server(url, extra=args)]
        servers += [start_server(url, extra=args) for _ in range(2)]
        try:
            ids = {_status(srv)["me"]: srv for srv in servers}
            st = _leader(servers)
            first = ids[st["leader"]]
            assert {s["id"] for s in st["servers"] if s["up"]} == set(ids)
            with servers[1].client() as c:  # a pool and a node, through a follower
                ok(c.post("/pools", json={"name": "p", "gpu": True}), 201)
                gpus = [{"index": i, "model": "H100", "uuid": f"GPU-n{i}"} for i in range(8)]
                for n in range(4):
                    ok(c.put(f"/nodes/n{n}", json={"pool": "p", "gpus": gpus}))
            made: list[int] = []
            dead: list[Server] = []  # killed or paused: not asked
            turn = itertools.cycle(range(3))

            def storm(k: int) -> None:
                for _ in range(k):
                    srv = servers[next(turn)]
                    while srv in dead:
                        srv = servers[next(turn)]
                    with srv.client() as c:
                        r = c.post(
                            "/jobs", json={"command": ["x"], "gpus": 1, "pool": "p", "time_limit": "1h"}
                        )
                    if r.status_code == 201:
                        made.append(r.json()["id"])

            storm(6)
            first.proc.send_signal(signal.SIGKILL)  # the leader dies
            first.proc.wait()
            dead.append(first)
            st2 = _leader([s for s in servers if s is not first], not_in={st["leader"]})
            second = ids[st2["leader"]]
            assert st2["epoch"] > st["epoch"]
            storm(6)
            second.proc.send_signal(signal.SIGSTOP)  # the next leader pauses past its lease
            dead.append(second)
            try:
                st3 = _leader(
                    [ids[i] for i in ids if i not in (st["leader"], st2["leader"])], not_in={st2["leader"]}
                )
                assert st3["epoch"] > st2["epoch"]
                storm(6)
            finally:
                second.proc.send_signal(signal.SIGCONT)
                dead.remove(second)
            deadline = time.monotonic() + 10  # it wakes: its keeper sees the newer holder
            while _status(second)["leader"] != st3["leader"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(1.0)  # a keeper's look (a third of the TTL) and then some: its loops stopped
            storm(6)
            deadline = time.monotonic() + 15
            engine = create_engine(url)
            try:
                while True:
                    with engine.connect() as c:
                        states = dict(c.execute(text("SELECT id, state FROM jobs")).all())
                    if all(states.get(j) == "SCHEDULED" for j in made) or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                assert set(made) <= set(states) and len(made) == 24
                assert all(states[j] == "SCHEDULED" for j in made), states
                with engine.connect() as c:
                    held = c.execute(
                        text("SELECT node, gpu_index, count(*) FROM allocations GROUP BY 1, 2")
                    ).all()
                    events = c.execute(
                        text("SELECT id, epoch FROM job_events WHERE epoch IS NOT NULL ORDER BY id")
                    ).all()
                    placed = c.execute(
                        text(
                            "SELECT job_id, count(*) FROM job_events WHERE to_state = 'SCHEDULED' GROUP BY 1"
                        )
                    ).all()
            finally:
                engine.dispose()
            assert all(n == 1 for _, _, n in held)  # no GPU given twice
            assert all(n == 1 for _, n in placed)  # no job placed twice
            epochs = [e for _, e in events]
            assert epochs == sorted(epochs) and epochs[-1] == st3["epoch"]  # no write under a stale epoch
            # a reading that reaches a follower reaches the leader's health rules (pgnotify)
            fatal = {"index": 0, "temperature_c": 40.0, "xid_events": [79]}
            with second.client() as c:
                ok(c.post("/nodes/n3/sync", json={"jobs": [], "telemetry": [fatal]}))
            deadline = time.monotonic() + 10
            while True:
                with ids[st3["leader"]].client() as c:
                    gpu0 = ok(c.get("/nodes/n3"))["gpus"][0]
                if gpu0["cordoned"] or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert gpu0["cordoned"] and "79" in (gpu0["cordon_reason"] or ""), gpu0
        finally:
            for srv in servers:
                if srv.proc.poll() is None:
                    stop_server(srv)
