"""The scheduling pass's view of job dependencies: which waiting jobs may not start yet
(``scheduler.Blocked``), judged each pass by ``scheduler/deps.py`` against the states
in the database (one query for every job the waiting jobs name, one for singletons).

A dependency's verdict changes without the waiting job changing (its predecessor
ended), so it is not cached with the job's request; the pass is woken when a job ends,
which is when a verdict can change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.scheduler import Blocked
from gpufleet.scheduler.deps import Dependency, DependencyError, Phase, Ref, judge, parse
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.store.models import Job

PHASES = {
    JobState.PENDING: Phase.WAITING,
    JobState.HELD: Phase.WAITING,
    JobState.PREEMPTED: Phase.WAITING,
    JobState.REQUEUED: Phase.WAITING,
    JobState.SCHEDULED: Phase.STARTED,
    JobState.RUNNING: Phase.STARTED,
    JobState.COMPLETED: Phase.OK,
    JobState.FAILED: Phase.NOT_OK,
    JobState.TIMEOUT: Phase.NOT_OK,
    JobState.CANCELLED: Phase.NOT_OK,
}
_LIVE = [str(st) for st, ph in PHASES.items() if ph in (Phase.WAITING, Phase.STARTED)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """A waiting job with a dependency, as the pass read it."""

    id: int
    user_id: int
    name: str
    dependency: str


_parsed: dict[str, Dependency | None] = {}


def _parse(text: str) -> Dependency | None:
    hit = _parsed.get(text, ...)
    if hit is ...:
        try:
            hit = parse(text)
        except DependencyError:  # stored before a rule changed: treat as never satisfiable
            hit = None
        if len(_parsed) > 10_000:
            _parsed.clear()
        _parsed[text] = hit
    return hit


def blocked(s: Session, waiting: Sequence[Waiting]) -> dict[int, Blocked]:
    """The waiting jobs whose dependency does not hold now, and why."""
    if not waiting:
        return {}
    deps = {w.id: _parse(w.dependency) for w in waiting}
    ids = sorted({r.job for d in deps.values() if d is not None for r in d.refs})
    jobs: dict[int, tuple[Phase, int | None, int | None]] = {}
    arrays: dict[int, list[tuple[int, int | None, Phase]]] = {}
    if ids:
        q = select(Job.id, Job.state, Job.array_job_id, Job.array_task_id).where(
            Job.id.in_(ids) | Job.array_job_id.in_(ids)
        )
        for jid, state, array, task in s.execute(q):
            phase = PHASES[JobState(state)]
            jobs[jid] = (phase, array, task)
            if array is not None:
                arrays.setdefault(array, []).append((jid, task, phase))

    def lookup(ref: Ref) -> Iterable[tuple[str, Phase]]:
        tasks = arrays.get(ref.job)
        if ref.task is None:
            if tasks:  # an array's id: every task of it
                return [(str(jid), ph) for jid, _, ph in tasks]
            hit = jobs.get(ref.job)
            return [] if hit is None else [(str(ref.job), hit[0])]
        return [(str(jid), ph) for jid, task, ph in tasks or () if task == ref.task]

    singles = _singleton_blockers(s, [w for w in waiting if (d := deps[w.id]) is not None and d.singleton])
    out: dict[int, Blocked] = {}
    for w in waiting:
        dep = deps[w.id]
        if dep is None:
            out[w.id] = Blocked(
                code="DependencyNeverSatisfied", detail=f"cannot read {w.dependency!r}", never=True
            )
            continue
        v = judge(dep, lookup, singleton_blockers=singles.get(w.id, ()))
        if not v.satisfied:
            out[w.id] = Blocked(code=v.code, detail=v.detail, after=v.waiting_on, never=v.never)
    return out


def _singleton_blockers(s: Session, waiting: Sequence[Waiting]) -> dict[int, list[str]]:
    """For each job: earlier jobs (lower id) of its user with its name, not yet ended."""
    if not waiting:
        return {}
    q = select(Job.id, Job.user_id, Job.name).where(
        Job.state.in_(_LIVE),
        Job.user_id.in_({w.user_id for w in waiting}),
        Job.name.in_({w.name for w in waiting}),
    )
    live: dict[tuple[int, str], list[int]] = {}
    for jid, uid, name in s.execute(q):
        live.setdefault((uid, name), []).append(jid)
    return {w.id: [str(j) for j in sorted(live.get((w.user_id, w.name), [])) if j < w.id] for w in waiting}
