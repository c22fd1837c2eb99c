"""The simulator and the server make the same decisions (DESIGN.md's one rule).

One job list is replayed through both: the simulator (``gpufleet.sim.engine``) and the
server's own scheduling pass (``loops/scheduling.SchedulingPass``) on a SQLite database
with a fake clock, driven by the same event rules (a pass at each arrival or finish,
rounded up to the scheduling interval; preemptive policies also every preemption
interval while jobs wait). GPU jobs of several widths, 0-GPU jobs (placed by the core
on the least busy node), team quotas and a team held by its hard budget (the server:
a budget of 0; the simulator: a ``Hold``) are in the list, and one rack has a power
budget (the server: a ``rack_power`` row; the simulator: ``SimConfig.power``) that keeps
it from running all its GPUs at once. Every start (when, which job, on exactly which
GPUs) and every preemption must be the same.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import update

from gpufleet.clock import FakeClock
from gpufleet.scheduler import Fleet, Hold, Node, Plan, Quota, Snapshot, make_policy
from gpufleet.scheduler.powermodel import PowerModel, RackBudget
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import move, ref, release_attempt
from gpufleet.server.loops.scheduling import PassObserver, SchedulingPass
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import GpuRow, Job, Membership, NodeRow, RackPowerRow, Team, User
from gpufleet.sim.config import FleetSpec, SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.trace import TraceJob

STEP = 10.0  # the scheduling interval (s): every time in the job list is a multiple
PREEMPT_EVERY = 60.0
CHECKPOINT = 6 * STEP  # jobs checkpoint this often: a preempted one loses the work since its last
T0 = 1_800_000_000.0  # the server's clock at trace time 0
HELD = "c"
QUOTAS = (Quota(team="a", gpus=20), Quota(team="b", gpus=12, limit=16), Quota(team=HELD, gpus=4))

Event = tuple[float, str, tuple[tuple[str, tuple[int, ...]], ...]]
"""(trace time, job id, placement as (node, GPU indices) pairs)."""


POWER = RackBudget(rack="rack-001", budget_w=15_000.0, headroom=0.25)
"""Nodes 2 and 3 idle at 2 x (1500 + 8 x 70) W; the cap, 11.25 kW, powers 11 of their 16
GPUs (630 W each above idle)."""
POWERED = 11

OLD_DRIVER = "node-0000"
"""Its driver supports CUDA 12.2, the others' 12.4: jobs that need 12.4 never go there."""


def _fleet() -> Fleet:
    gpu_nodes = tuple(
        dataclasses.replace(n, cuda=(12, 2) if n.name == OLD_DRIVER else (12, 4))
        for n in FleetSpec(nodes=4, gpus_per_node=8, nodes_per_leaf=2).build().nodes
    )
    cpu = Node(name="node-cpu", gpus=(), leaf="leaf-009", rack="rack-009")
    return Fleet(nodes=(*gpu_nodes, cpu))


def _jobs(seed: int = 11, n: int = 48) -> list[TraceJob]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gpus = rng.choice([0, 1, 1, 2, 4, 4, 8, 8, 16])
        duration = STEP * rng.randint(3, 60)
        out.append(
            TraceJob(
                job_id=str(i + 1),  # the server's ids: 1, 2, ... in submit order
                user=f"u{i % 3}",
                team=rng.choice(["a", "a", "b", HELD]),
                submit_s=STEP * rng.randint(0, 90),
                duration_s=duration,
                gpus=gpus,
                time_limit_s=duration + STEP * rng.randint(0, 6),
                priority=rng.choice([0, 0, 0, 1]),
                cuda="12.4" if i % 4 == 0 and gpus else None,
            )
        )
    out.sort(key=lambda j: (j.submit_s, int(j.job_id)))
    return [TraceJob(**{**_fields(j), "job_id": str(k + 1)}) for k, j in enumerate(out)]


def _fields(j: TraceJob) -> dict[str, object]:
    return {name: getattr(j, name) for name in TraceJob.__dataclass_fields__}


def _placement(plan_start: object) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((p.node, tuple(p.gpus)) for p in plan_start.placement)  # type: ignore[attr-defined]


# -- the simulator -----------------------------------------------------------------------------


def simulate(jobs: list[TraceJob], policy: str) -> tuple[list[Event], list[tuple[float, str]]]:
    cfg = SimConfig(
        restart_overhead_s=0.0,
        checkpoint_interval_s=CHECKPOINT,
        sched_interval_s=STEP,
        preempt_interval_s=PREEMPT_EVERY,
        quotas=QUOTAS,
        holds=(Hold(team=HELD, reason="held"),),
        power=PowerModel(racks=(POWER,)),
    )
    sim = Simulator(jobs, _fleet(), make_policy(policy), cfg, record=True)
    sim.run()
    _check_power(sim.log)
    starts = [
        (t, job, tuple((p.node, tuple(p.gpus)) for p in pl))
        for t, what, job, pl in sim.log
        if what == "start"
    ]
    return starts, sorted(_preemptions(sim.log))


def _check_power(log: list[tuple[float, str, str, object]]) -> None:
    """The budgeted rack never held more than ``POWERED`` GPUs at once, and was full."""
    rack = {n.name for n in _fleet().nodes if n.rack == POWER.rack}
    held: dict[str, int] = {}
    busy = peak = 0
    for _, what, job, placement in log:
        if what == "start":
            held[job] = sum(len(p.gpus) for p in placement if p.node in rack)  # type: ignore[attr-defined]
            busy += held[job]
        elif what == "stop":
            busy -= held.pop(job, 0)
        peak = max(peak, busy)
    assert peak == POWERED


def _preemptions(log: list[tuple[float, str, str, object]]) -> list[tuple[float, str]]:
    """The simulator logs a finish as a stop too: every job runs to its end, so each
    stop of a job but its last is a preemption."""
    stops: dict[str, list[float]] = {}
    for t, what, job, _ in log:
        if what == "stop":
            stops.setdefault(job, []).append(t)
    return [(t, job) for job, times in stops.items() for t in times[:-1]]


# -- the server ---------------------------------------------------------------------------------


@dataclass
class ServerReplay:
    """The server's scheduling pass driven through the job list in fake time: arrivals
    are inserted as the API would; a started job is confirmed RUNNING and a finished
    one completed as its agent's sync would; a preempted job's nodes confirm its stop
    at once and it keeps the work up to its last checkpoint (every ``CHECKPOINT`` from
    each start), as in the simulator."""

    db: dbmod.Database
    policy: str
    jobs: list[TraceJob]
    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))
    starts: list[Event] = field(default_factory=list)
    preemptions: list[tuple[float, str]] = field(default_factory=list)

    def run(self) -> None:
        observer = PassObserver(on_pass=self._record)
        step = SchedulingPass(
            db=self.db,
            policy=make_policy(self.policy),
            clock=self.clock,
            node_timeout_s=1e12,
            observer=observer,
        )
        preemptive = make_policy(self.policy).preemptive
        remaining = {j.job_id: j.duration_s for j in self.jobs}
        running: dict[str, float] = {}  # job -> when its attempt started
        # The simulator's event order: at one instant, arrivals, then finishes, then the
        # pass (a pass at t sees every submit and exit of t), each kind in the order it
        # was pushed.
        events: list[tuple[float, int, int, str]] = []  # (t, kind, seq, job): 0 arrival, 1 finish, 2 pass
        seq = 0

        def push(at: float, kind: int, job_id: str = "") -> None:
            nonlocal seq
            heapq.heappush(events, (at, kind, seq, job_id))
            seq += 1

        for j in self.jobs:
            push(j.submit_s, 0, j.job_id)
        next_pass: float | None = None

        def want_pass(at: float) -> None:
            nonlocal next_pass
            at = math.ceil(at / STEP) * STEP
            if next_pass is None or at < next_pass:
                next_pass = at
                push(at, 2)

        finish_at: dict[str, float] = {}
        while events:
            t, kind, _, job_id = heapq.heappop(events)
            self.clock.t = T0 + t
            if kind == 0:
                self._submit(job_id)
                want_pass(t)
            elif kind == 1:
                if finish_at.get(job_id) != t or job_id not in running:
                    continue  # preempted meanwhile
                del running[job_id]
                remaining[job_id] = 0.0
                self._complete(job_id)
                want_pass(t)
            elif kind == 2 and t == next_pass:
                next_pass = None
                self._new_starts, self._new_preempts = [], []
                step.run_once()
                for pre in self._new_preempts:
                    ran = t - running.pop(pre)
                    remaining[pre] -= math.floor(ran / CHECKPOINT) * CHECKPOINT
                    self._confirm_stopped(pre)
                    self.preemptions.append((t, pre))
                for sid in self._new_starts:
                    self._confirm_running(sid)
                    running[sid] = t
                    finish_at[sid] = t + remaining[sid]
                    push(finish_at[sid], 1, sid)
                waiting = self._waiting()
                if preemptive and waiting:
                    want_pass(t + PREEMPT_EVERY)

    def _record(self, snapshot: Snapshot, plan: Plan, seconds: float) -> None:
        t = snapshot.now - T0
        for st in plan.starts:
            self.starts.append((t, st.job_id, _placement(st)))
            self._new_starts.append(st.job_id)
        self._new_preempts += [p.job_id for p in plan.preemptions]

    def _submit(self, job_id: str) -> None:
        tj = next(j for j in self.jobs if j.job_id == job_id)
        with self.db.write() as s:
            team = s.query(Team).filter_by(name=tj.team).one()
            user = s.query(User).filter_by(name=tj.user).one()
            job = Job(
                name=f"j{job_id}",
                user_id=user.id,
                team_id=team.id,
                pool="default",
                gpus=tj.gpus,
                gpus_per_node=tj.gpus_per_node,
                nodes=0,
                priority=tj.priority,
                time_limit_s=tj.time_limit_s,
                command=["x"],
                env={},
                state=str(JobState.PENDING),
                submit_time=T0 + tj.submit_s,
                pending_since=T0 + tj.submit_s,
                cuda=tj.cuda,
            )
            s.add(job)
            s.flush()
            assert str(job.id) == job_id

    def _complete(self, job_id: str) -> None:
        now = self.clock.now()
        with self.db.write() as s:
            job = s.get(Job, int(job_id))
            assert job is not None
            vals = release_attempt(s, job, now=now, confirmed=True) | {"exit_code": 0}
            move(s, ref(job), JobState.COMPLETED, actor="t", reason="exited 0", now=now, values=vals)

    def _confirm_running(self, job_id: str) -> None:
        now = self.clock.now()
        with self.db.write() as s:
            job = s.get(Job, int(job_id))
            assert job is not None
            move(
                s,
                ref(job),
                JobState.RUNNING,
                actor="t",
                reason="running",
                now=now,
                values={"started_at": now},
            )

    def _confirm_stopped(self, job_id: str) -> None:
        with self.db.write() as s:
            s.execute(update(Job).where(Job.id == int(job_id)).values(stopping_on=None))

    def _waiting(self) -> bool:
        """A pending job that could start (those of the held team never do)."""
        with self.db.read() as s:
            held = {t.id for t in s.query(Team).filter_by(name=HELD)}
            return any(j.team_id not in held for j in s.query(Job).filter(Job.state == str(JobState.PENDING)))


@pytest.fixture
def server_db(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'same.db'}"
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    jobs = _jobs()
    with db.write() as s:
        for q in QUOTAS:
            s.add(
                Team(
                    name=q.team,
                    quota_gpus=q.gpus,
                    quota_limit=q.limit,
                    budget_hard=0.0 if q.team == HELD else None,
                )
            )
        for name in sorted({j.user for j in jobs}):
            s.add(User(name=name, role="user", created_at=0))
        s.flush()
        teams = {t.name: t.id for t in s.query(Team)}
        for u in s.query(User):
            for tid in teams.values():
                s.add(Membership(user_id=u.id, team_id=tid))
        s.add(
            RackPowerRow(
                rack=POWER.rack,
                budget_w=POWER.budget_w,
                headroom=POWER.headroom,
                updated_at=0,
                updated_by="test",
            )
        )
        for node in _fleet().nodes:
            s.add(
                NodeRow(
                    name=node.name,
                    pool="default",
                    leaf=node.leaf,
                    rack=node.rack,
                    created_at=0,
                    last_seen=T0 + 1e9,
                    cuda_version=None if node.cuda is None else f"{node.cuda[0]}.{node.cuda[1]}",
                )
            )
            s.flush()
            s.add_all(
                GpuRow(
                    node=node.name,
                    index=g.index,
                    model=g.model,
                    memory_mb=g.memory_mb,
                    nvlink_domain=g.nvlink_domain,
                )
                for g in node.gpus
            )
    yield db
    db.dispose()


@pytest.mark.parametrize("policy", ["backfill", "fairshare", "default"])
def test_simulator_and_server_decide_the_same(server_db: dbmod.Database, policy: str) -> None:
    jobs = _jobs()
    assert {j.gpus for j in jobs} >= {0, 1, 8, 16} and HELD in {j.team for j in jobs}
    sim_starts, sim_preempted = simulate(jobs, policy)
    replay = ServerReplay(db=server_db, policy=policy, jobs=jobs)
    replay.run()
    assert sorted(replay.starts) == sorted(sim_starts)
    assert sorted(replay.preemptions) == sim_preempted
    started = {job for _, job, _ in sim_starts}
    assert not any(j.job_id in started for j in jobs if j.team == HELD)  # held: never started
    assert any(j.job_id in started for j in jobs if j.gpus == 0)  # 0-GPU jobs placed by the core
    assert len(started) >= len([j for j in jobs if j.team != HELD]) - 2
    needy = {j.job_id for j in jobs if j.cuda is not None}
    assert needy & started  # jobs that need CUDA 12.4 ran, never on the older driver
    assert not any(job in needy and any(n == OLD_DRIVER for n, _ in pl) for _, job, pl in sim_starts)


def test_server_replay_is_not_vacuous(server_db: dbmod.Database) -> None:
    """A different policy on the server side changes the decisions: the comparison above
    can fail."""
    jobs = _jobs()
    sim_starts, _ = simulate(jobs, "backfill")
    replay = ServerReplay(db=server_db, policy="fifo", jobs=jobs)
    replay.run()
    assert sorted(replay.starts) != sorted(sim_starts)
