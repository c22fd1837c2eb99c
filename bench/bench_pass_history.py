"""What the run-time predictor (issue 33, ``server/loops/history.py``) costs the server's
scheduling pass: the pass (``SchedulingPass.run_once``, SQLite, the configured policy)
with and without its predictor, on a full 400-GPU fleet (400 running 1-GPU jobs) with
PENDING jobs waiting and HISTORY ended jobs in the table.

Three passes are timed, each the median of REPS:

- *cold*: a new pass object (a restarted scheduler): the warm start reads the last
  20,000 ended jobs and every pending and running job is predicted and written;
- *steady*: the next pass, nothing changed (predictions cached by job id);
- *50 ended*: 50 more jobs ended since the last pass (the watermark's read).

With ``default`` the difference includes what the policy does with the predictions
(ranking by predicted remaining GPU-time, estimated starts from predicted ends); with
``fifo`` (which reads none) it is the read and the predictions alone.

Usage: ``flock /tmp/bench.lock python bench/bench_pass_history.py [PENDING] [HISTORY] [POLICY]``
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import insert, update

from gpufleet.clock import FakeClock
from gpufleet.scheduler import make_policy
from gpufleet.scheduler.predict import Prediction
from gpufleet.server.loops.history import EndedFeed
from gpufleet.server.loops.scheduling import SchedulingPass
from gpufleet.server.loops.snapshot import SnapshotReader, _JobRow
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import Allocation, GpuRow, Job, Membership, NodeRow, Team, User

T0 = 1_700_000_000.0
NODES, GPUS = 50, 8
REPS = 7


class _NoHistory(EndedFeed):
    def read(self, s: object, now: float) -> int:
        return 0


class _BaselineReader(SnapshotReader):
    """The reader as it was before predictions: no history read, no prediction."""

    def __init__(self) -> None:
        super().__init__()
        self.history = _NoHistory()

    def _predict(self, job: _JobRow) -> Prediction | None:
        return None


def _job(
    rng: random.Random, *, users: list[int], teams: list[int], state: str, at: float
) -> dict[str, object]:
    u = rng.randrange(len(users))
    return {
        "name": f"exp{rng.randrange(300)}",
        "user_id": users[u],
        "team_id": teams[u % len(teams)],
        "pool": "default",
        "gpus": 1,
        "gpus_per_node": 0,
        "nodes": 0,
        "priority": 0,
        "time_limit_s": 86_400.0,
        "command": ["x"],
        "env": {},
        "state": state,
        "version": 0,
        "submit_time": at - 7200,
        "pending_since": at - 7200,
        "attained_service_s": 0.0,
        "executed_s": rng.lognormvariate(7, 1.5) if state not in ("PENDING", "RUNNING") else 0.0,
        "started_at": at - 3600 if state != "PENDING" else None,
        "scheduled_at": at - 3600 if state != "PENDING" else None,
        "ended_at": at if state not in ("PENDING", "RUNNING") else None,
    }


def seed(url: str, *, pending: int, history: int) -> tuple[list[int], list[int]]:
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    rng = random.Random(7)
    with db.write() as s:
        for t in range(3):
            s.add(Team(name=f"team{t}"))
        for u in range(20):
            s.add(User(name=f"user{u}", role="user", created_at=0))
        s.flush()
        teams = [t.id for t in s.query(Team)]
        users = [u.id for u in s.query(User)]
        for i, uid in enumerate(users):
            s.add(Membership(user_id=uid, team_id=teams[i % len(teams)]))
        for n in range(NODES):
            s.add(NodeRow(name=f"n{n:02d}", pool="default", created_at=0, last_seen=T0 + 1e9))
            s.flush()
            s.add_all(GpuRow(node=f"n{n:02d}", index=g, model="H100", memory_mb=81_559) for g in range(GPUS))
        states = ["COMPLETED"] * 6 + ["FAILED", "TIMEOUT", "CANCELLED"]
        rows = [
            _job(rng, users=users, teams=teams, state=rng.choice(states), at=T0 - 86_400 + i)
            for i in range(history)
        ]
        s.execute(insert(Job), rows)
        first = len(rows)
        s.execute(
            insert(Job),
            [_job(rng, users=users, teams=teams, state="RUNNING", at=T0) for _ in range(NODES * GPUS)],
        )
        s.execute(
            insert(Allocation),
            [
                {"job_id": first + 1 + i, "node": f"n{i // GPUS:02d}", "gpu_index": i % GPUS}
                for i in range(NODES * GPUS)
            ],
        )
        s.execute(
            insert(Job), [_job(rng, users=users, teams=teams, state="PENDING", at=T0) for _ in range(pending)]
        )
    db.dispose()
    return users, teams


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    pending = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    history = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    policy = sys.argv[3] if len(sys.argv) > 3 else "default"
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        users, teams = seed(url, pending=pending, history=history)
        db = dbmod.Database.connect(url)
        clock = FakeClock(T0)
        rng = random.Random(11)
        results: dict[str, dict[str, list[float]]] = {
            v: {"cold": [], "steady": [], "50 ended": []} for v in ("without", "with")
        }
        for _ in range(REPS):
            for variant, res in results.items():  # interleaved: the machine's drift hits both
                with db.write() as s:  # a restarted scheduler with no prediction stored yet
                    cleared = {"predicted_s": None, "predicted_conf": None, "prediction_basis": None}
                    s.execute(update(Job).values(**cleared))
                step = SchedulingPass(db=db, policy=make_policy(policy), clock=clock, node_timeout_s=1e12)
                if variant == "without":
                    step._reader = _BaselineReader()
                res["cold"].append(timed(step.run_once))
                clock.advance(1.0)
                res["steady"].append(timed(step.run_once))
                clock.advance(1.0)
                ended = [
                    _job(rng, users=users, teams=teams, state="COMPLETED", at=clock.now()) for _ in range(50)
                ]
                with db.write() as s:
                    s.execute(insert(Job), ended)
                res["50 ended"].append(timed(step.run_once))
                clock.advance(1.0)
        db.dispose()
    running = NODES * GPUS
    print(f"scheduling pass, SQLite, policy {policy}: {pending} pending, {running} running, {history} ended")
    print(f"median of {REPS} runs, ms")
    print(f"{'pass':<10} {'without':>9} {'with':>9} {'ratio':>7}")
    for name in ("cold", "steady", "50 ended"):
        a = statistics.median(results["without"][name]) * 1000
        b = statistics.median(results["with"][name]) * 1000
        print(f"{name:<10} {a:>9.1f} {b:>9.1f} {b / a:>7.2f}")


if __name__ == "__main__":
    main()
