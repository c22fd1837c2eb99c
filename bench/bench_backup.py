"""Backups while the server writes: how long a backup and a restore take, and what a
backup costs the writes that go on meanwhile (``store/backup.py``).

For each database (a temp SQLite file; PostgreSQL with ``--pg URL``, which must name an
existing database this bench may empty) it seeds ``--jobs`` jobs with one event each,
then one writer thread commits a job event per transaction through ``Database.write``
(the server's write path) back to back: first for ``--seconds`` alone (baseline), then
while ``backup()`` runs. It prints the backup's time and size, the restore's time into
an empty database, and the writer's commit latency (p50, p99, max) and commit rate in
both phases: SQLite's backup API reads one snapshot while the WAL writer goes on;
``pg_dump`` reads a repeatable-read snapshot.

    flock /tmp/bench.lock .venv/bin/python bench/bench_backup.py [--jobs 50000] [--pg URL]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import MetaData, create_engine, insert, text
from sqlalchemy.engine import make_url

from gpufleet.server.store import backup as store
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import Job, JobEvent, Team, User


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    commits: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    backup_s: float
    size: int
    restore_s: float
    base: Phase
    during: Phase


def seed(db: dbmod.Database, jobs: int) -> None:
    with db.write() as s:
        s.add_all([User(id=1, name="admin", role="admin", created_at=0), Team(id=1, name="ml")])
    row = {
        "name": "j", "user_id": 1, "team_id": 1, "pool": "default", "gpus": 1, "gpu_type": "H100",
        "priority": 0, "command": ["python", "train.py"], "env": {"SEED": "1"}, "state": "COMPLETED",
        "submit_time": 1.0, "pending_since": 1.0,
    }  # fmt: skip
    batch = 5000
    for start in range(0, jobs, batch):
        n = min(batch, jobs - start)
        with db.write() as s:
            s.execute(insert(Job), [{**row, "id": start + i + 1} for i in range(n)])
            events = [
                {
                    "job_id": start + i + 1,
                    "at": 1.0,
                    "actor": "admin",
                    "to_state": "PENDING",
                    "reason": "submitted",
                }
                for i in range(n)
            ]
            s.execute(insert(JobEvent), events)


class Writer(threading.Thread):
    """One job event per transaction, back to back; records each commit's latency."""

    def __init__(self, db: dbmod.Database) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            with self.db.write() as s:
                s.add(JobEvent(job_id=1, at=time.time(), actor="bench", to_state="RUNNING", reason=""))
            self.latencies.append(time.perf_counter() - t)


def phase(latencies: list[float], seconds: float) -> Phase:
    ms = sorted(x * 1000 for x in latencies) or [0.0]
    return Phase(
        commits=len(latencies),
        seconds=seconds,
        p50_ms=statistics.median(ms),
        p99_ms=ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        max_ms=ms[-1],
    )


def measure(url: str, target: str, jobs: int, seconds: float, out: Path) -> Result:
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    seed(db, jobs)
    writer = Writer(db)
    writer.start()
    time.sleep(seconds)
    base = phase(list(writer.latencies), seconds)
    mark = len(writer.latencies)
    t = time.perf_counter()
    made = store.backup(url, out)
    backup_s = time.perf_counter() - t
    during = phase(writer.latencies[mark:], backup_s)
    writer.stop.set()
    writer.join(10)
    db.dispose()
    t = time.perf_counter()
    store.restore(out, target)
    restore_s = time.perf_counter() - t
    return Result(backup_s=backup_s, size=made.size, restore_s=restore_s, base=base, during=during)


def empty_pg(url: str) -> None:
    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    meta.drop_all(engine)
    with engine.begin() as c:
        c.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()


def row(name: str, r: Result) -> str:
    base, during = r.base, r.during
    return (
        f"{name:<11}{r.backup_s:>9.2f}{r.size / 1e6:>9.1f}{r.restore_s:>10.2f}"
        f"{base.commits / base.seconds:>9.0f}{base.p50_ms:>7.1f}{base.p99_ms:>7.1f}{base.max_ms:>8.1f}"
        f"{during.commits / max(during.seconds, 1e-9):>9.0f}{during.p50_ms:>7.1f}{during.p99_ms:>7.1f}"
        f"{during.max_ms:>8.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=3.0, help="baseline writing time")
    ap.add_argument("--pg", default=None, help="PostgreSQL URL of a database to empty and use")
    args = ap.parse_args()
    print(f"{args.jobs} jobs + events; one writer committing a job event per transaction")
    print(
        f"{'database':<11}{'backup s':>9}{'MB':>9}{'restore s':>10}"
        f"{'base/s':>9}{'p50ms':>7}{'p99ms':>7}{'maxms':>8}{'during/s':>9}{'p50ms':>7}{'p99ms':>7}{'maxms':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        r = measure(
            f"sqlite:///{d / 'src.db'}", f"sqlite:///{d / 'dst.db'}", args.jobs, args.seconds, d / "b.db"
        )
        print(row("sqlite", r))
        if args.pg:
            target = make_url(args.pg).set(database=f"{make_url(args.pg).database}_bench_dst")
            admin = create_engine(make_url(args.pg).set(database="postgres"), isolation_level="AUTOCOMMIT")
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{target.database}" WITH (FORCE)'))
                c.execute(text(f'CREATE DATABASE "{target.database}"'))
            empty_pg(args.pg)
            try:
                dst = target.render_as_string(hide_password=False)
                r = measure(args.pg, dst, args.jobs, args.seconds, d / "b.dump")
                print(row("postgresql", r))
            finally:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{target.database}" WITH (FORCE)'))
                admin.dispose()
                empty_pg(args.pg)


if __name__ == "__main__":
    main()
