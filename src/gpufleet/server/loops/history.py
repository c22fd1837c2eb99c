"""The scheduling pass's predictor of run times, fed from the server's own history
(issue 33): ``scheduler/predict.py``'s ``DurationPredictor``, kept by the pass's
``SnapshotReader`` and read by it once per job.

*What teaches.* A batch job that ended COMPLETED, FAILED or TIMEOUT: how long it ran is
how long such a job runs (a failure that comes early comes early again; a job that hit
its limit would have run at least that long). A CANCELLED job is left out: someone
stopped it, and its run time says when they lost patience, not how long the work takes.
Service replicas are left out too: they run until scaled down. The run time is the
job's ``executed_s`` (the sum of all its attempts: a job preempted and requeued ran
the sum), or, for a row without it, its last attempt (``ended_at - started_at``).

*When.* At the first pass, the most recent ``warm_limit`` such jobs, oldest first; then,
each pass, only the jobs that ended since (a watermark on ``ended_at``, index
``ix_jobs_ended_at``): never a full reload. A job's end may commit a little after the
stamp it carries (a transaction waiting for the write lock), so each read goes back
``lag_s`` before the watermark and skips the ids it already took (``EndedFeed``, pure).
Causal by construction: only jobs that ended are read.

*Per job.* A job's prediction is made once, when a pass first sees it (pending or
running), and written on its row (``predicted_s``, ``predicted_conf``,
``prediction_basis``: the API shows them) in that pass's transaction; a later pass, or a
restarted scheduler, reads it back instead of predicting again (``Predictions``). A job
first seen with no history enough keeps none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.scheduler.predict import DurationPredictor, JobTraits, Prediction
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.store.models import Job

TEACHING: frozenset[str] = frozenset(
    str(st) for st in (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT)
)
"""The end states whose run time teaches the predictor (the module's docstring says why)."""
BATCH = "batch"


class Ended(NamedTuple):
    """An ended job as the predictor learns it (one row of ``_ENDED``)."""

    id: int
    state: str
    kind: str
    ended_at: float
    started_at: float | None
    executed_s: float
    user_id: int
    team_id: int
    name: str
    gpus: int
    time_limit_s: float | None


_ENDED = select(*(getattr(Job, name) for name in Ended._fields))


def traits(*, user_id: int, team_id: int, name: str, gpus: int, time_limit_s: float | None) -> JobTraits:
    """What a job's history is looked up by: its owner and team by id (a rename keeps
    its history), its name (the table keeps no script hash), its GPUs and time limit."""
    return JobTraits(user=f"u{user_id}", team=f"t{team_id}", name=name, gpus=gpus, time_limit_s=time_limit_s)


def run_time(row: Ended) -> float:
    """All its attempts' run time; a row without it (0): its last attempt's."""
    if row.executed_s > 0:
        return row.executed_s
    if row.started_at is not None:
        return max(0.0, row.ended_at - row.started_at)
    return 0.0


def teaches(row: Ended) -> bool:
    return row.state in TEACHING and row.kind == BATCH


@dataclass(slots=True)
class EndedFeed:
    """Which ended jobs to learn from, pass after pass (pure: the reads are the caller's).

    ``warm(rows, now)`` takes the first read (the most recent ended jobs: only the last
    ``warm_limit`` of them are learnt); then each pass ``window()`` says from when to
    read the ids of ended jobs, ``fresh(pairs)`` which of those ids were not taken yet,
    and ``learn(rows)`` feeds the predictor those that teach, in the order they ended."""

    predictor: DurationPredictor = field(default_factory=DurationPredictor)
    warm_limit: int = 20_000
    lag_s: float = 30.0
    """How late a job's end may commit after its ``ended_at`` and still be learnt."""
    watermark: float | None = None
    """The latest ``ended_at`` taken (None: not warmed yet)."""
    _taken: set[tuple[int, float]] = field(default_factory=set)
    """(id, ended_at) taken within ``lag_s`` of the watermark: a read that goes back that
    far sees them again and must skip them. By the pair, not the id: a job preempted
    and requeued has an ``ended_at`` of its attempt, then another when it ends."""
    learnt: int = 0

    def warm(self, rows: Iterable[Ended], *, now: float) -> int:
        """The first read: the most recent ended jobs (any order); how many taught."""
        recent = sorted((r for r in rows if teaches(r)), key=lambda r: (r.ended_at, r.id))
        recent = recent[-self.warm_limit :] if self.warm_limit > 0 else []
        # ``now``: anything that ended before the read and is not in it is older than
        # the ``warm_limit`` most recent (or did not teach); anything later is read after
        self.watermark = max([now, *(r.ended_at for r in recent)])
        floor = self.watermark - self.lag_s
        self._taken = {(r.id, r.ended_at) for r in recent if r.ended_at >= floor}
        return self.learn(recent)

    def window(self) -> float | None:
        """Read the ids of jobs that ended at or after this (None: ``warm`` first)."""
        return None if self.watermark is None else self.watermark - self.lag_s

    def fresh(self, pairs: Iterable[tuple[int, float]]) -> set[tuple[int, float]]:
        """Of the (id, ended_at) read from ``window()``, those not taken yet, now taken;
        the watermark moves to the latest."""
        assert self.watermark is not None, "warm() first"
        taken = self._taken
        out = {p for p in pairs if p not in taken}
        if out:
            taken |= out
            self.watermark = max(self.watermark, max(t for _, t in out))
            floor = self.watermark - self.lag_s
            self._taken = {p for p in taken if p[1] >= floor}
        return out

    def learn(self, rows: Iterable[Ended]) -> int:
        """Feed the rows that teach, oldest end first; how many."""
        n = 0
        for r in sorted(rows, key=lambda r: (r.ended_at, r.id)):
            if teaches(r):
                t = traits(
                    user_id=r.user_id,
                    team_id=r.team_id,
                    name=r.name,
                    gpus=r.gpus,
                    time_limit_s=r.time_limit_s,
                )
                self.predictor.observe(t, run_time(r))
                n += 1
        self.learnt += n
        return n

    # -- the reads (the database's side) -----------------------------------------------------

    def read(self, s: Session, now: float) -> int:
        """This pass's read: the warm start, or the jobs that ended since the last pass;
        how many taught the predictor."""
        teaching = (Job.state.in_(sorted(TEACHING)), Job.kind == BATCH)
        since = self.window()
        if since is None:
            q = _ENDED.where(*teaching, Job.ended_at.is_not(None))
            q = q.order_by(Job.ended_at.desc()).limit(self.warm_limit)
            return self.warm([Ended(*r) for r in s.execute(q)], now=now)
        q_ids = select(Job.id, Job.ended_at).where(Job.ended_at >= since)
        new = self.fresh((jid, t) for jid, t in s.execute(q_ids).tuples() if t is not None)
        if not new:
            return 0
        ids = sorted({jid for jid, _ in new})
        rows: list[Ended] = []
        for i in range(0, len(ids), 1000):  # bounded IN lists
            q = _ENDED.where(Job.id.in_(ids[i : i + 1000]), *teaching)
            # a row whose end moved since the ids were read: the next read takes it
            rows += [r for r in map(Ended._make, s.execute(q)) if (r.id, r.ended_at) in new]
        return self.learn(rows)


@dataclass(slots=True)
class Predictions:
    """Each job's prediction, made once (this loop's own cache, by job id); the ones
    made since the last committed ``write`` wait in ``new``."""

    rows: dict[int, Prediction | None] = field(default_factory=dict)
    new: dict[int, Prediction] = field(default_factory=dict)

    def of(
        self,
        predictor: DurationPredictor,
        *,
        job_id: int,
        job: JobTraits,
        stored: tuple[float | None, float | None, str | None],
    ) -> Prediction | None:
        """``job``'s prediction: this loop's, else its row's (``stored``: predicted_s,
        predicted_conf, prediction_basis), else a new one from the history."""
        try:
            return self.rows[job_id]
        except KeyError:
            pass
        seconds, conf, basis = stored
        if seconds is not None:
            got: Prediction | None = Prediction(duration_s=seconds, confidence=conf or 0.0, basis=basis or "")
        else:
            got = predictor.predict(job)
            if got is not None:
                self.new[job_id] = got
        self.rows[job_id] = got
        return got

    def keep(self, count: int, live: Callable[[], Set[int]]) -> None:
        """Forget the jobs no longer pending or running once they are most of the cache
        (``count`` of them are; ``live()`` says which)."""
        if len(self.rows) > 2 * count + 1000:
            ids = live()
            self.rows = {j: p for j, p in self.rows.items() if j in ids or j in self.new}

    def write(self, s: Session) -> int:
        """Write the new predictions on their rows (in the pass's transaction: not part
        of the CAS, no version bump, like the pending statuses); how many."""
        if not self.new:
            return 0
        values: list[dict[str, Any]] = [
            {
                "id": jid,
                "predicted_s": p.duration_s,
                "predicted_conf": round(p.confidence, 4),
                "prediction_basis": p.basis[:64],
            }
            for jid, p in self.new.items()
        ]
        s.execute(update(Job), values)
        return len(values)

    def written(self) -> None:
        """The pass that wrote them committed (a rejected one writes them again)."""
        self.new = {}
