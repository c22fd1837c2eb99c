"""Changes to many waiting jobs at once: a whole array, a user's jobs, a name (issue 35).

A job array of 10,000 tasks is 10,000 rows; cancelling it one compare-and-set
transaction per task took 20-30 s. Here each change of the jobs that *wait* (PENDING,
HELD: no node runs them, no GPU is theirs, no cost accrues) is ONE ``UPDATE ... WHERE
<match> AND state = :from RETURNING id`` and one multi-row insert of their job events,
in one transaction: the state check is in the statement, so a job the scheduler placed
meanwhile is simply not matched (it is left to the caller's per-job path, which tells
its agents), and every moved job has its event, as ``jobstate.transitions.move`` writes
it (same columns, ``version`` bumped). A job that runs is never changed here.

The match (``Match``) is ``CancelMany``'s: every field given, among the caller's own
jobs (an operator's: anyone's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, insert, literal, or_, select, update
from sqlalchemy.orm import Session

from gpufleet.api.bulk import JobsChanged
from gpufleet.api.jobs import JobUpdate
from gpufleet.server.jobstate.states import TERMINAL, JobState, allowed
from gpufleet.server.jobstate.transitions import event_row
from gpufleet.server.problems import Failure, forbidden, invalid
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.submitopts import time_limit
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.leader import EPOCH
from gpufleet.server.store.models import Job, JobEvent, User
from gpufleet.timefmt import format_duration

LIVE = tuple(str(st) for st in JobState if st not in TERMINAL)
WAITING = (JobState.PENDING, JobState.HELD)


@dataclass(frozen=True, slots=True, kw_only=True)
class Match:
    """Which jobs (every field given; at least one)."""

    ids: Sequence[int] | None = None
    array: int | None = None
    user: str | None = None
    states: Sequence[JobState] = ()
    name: str | None = None


def where(actor: Principal, m: Match) -> list[ColumnElement[bool]] | Failure:
    """The match as conditions on ``jobs`` alone (no join: an ``UPDATE`` takes them), or
    why not: nothing said (422), another user's jobs asked by a plain user (403)."""
    if m.ids is None and m.array is None and m.user is None and not m.states and m.name is None:
        return invalid("say which jobs: ids, array, user, states or name")
    conds: list[ColumnElement[bool]] = [Job.state.in_(LIVE)]
    if not actor.is_operator:
        if m.user is not None and m.user != actor.name:
            return forbidden("only operators act on other users' jobs")
        conds.append(Job.user_id == actor.user_id)
    if m.ids is not None:
        conds.append(Job.id.in_(m.ids))
    if m.array is not None:
        conds.append(Job.array_job_id == m.array)
    if m.user is not None:
        conds.append(Job.user_id == select(User.id).where(User.name == m.user).scalar_subquery())
    if m.states:
        conds.append(Job.state.in_([str(st) for st in m.states]))
    if m.name is not None:
        conds.append(Job.name == m.name)
    return conds


def matching(s: Session, conds: Sequence[ColumnElement[bool]], states: Sequence[JobState]) -> list[int]:
    """The ids of the matched jobs in these states, in id order."""
    q = select(Job.id).where(*conds, Job.state.in_([str(st) for st in states]))
    return list(s.scalars(q.order_by(Job.id)))


_EVENT_COLUMNS = ("at", "actor", "from_state", "to_state", "reason", "epoch")
_CHUNK = 10_000
"""Ids a statement names at most (SQLite's limit on a statement's parameters: 32,766)."""


def move_all(
    s: Session,
    conds: Sequence[ColumnElement[bool]],
    src: JobState,
    to: JobState,
    *,
    actor: str,
    reason: str,
    now: float,
    values: dict[str, Any] | None = None,
) -> list[int]:
    """Every matched job in ``src`` to ``to`` (``src == to``: an audited change of
    ``values``, any live state), with its event: one ``UPDATE ... RETURNING`` and one
    ``INSERT ... SELECT`` of the events a 10,000 jobs (the event's values as literals:
    100,000 events in 0.2 s on SQLite, where rows of values took 0.7 s). A move leaves
    a waiting state only (such jobs hold nothing to release). Returns the ids moved, in
    id order."""
    if src != to and src not in WAITING:
        raise ValueError(f"move_all moves waiting jobs only, not {src}")
    if src != to and not allowed(src, to):
        raise ValueError(f"{src} -> {to}")
    res = s.execute(
        update(Job)
        .where(*conds, Job.state == str(src))
        .values(state=str(to), version=Job.version + 1, **(values or {}))
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    )
    ids = sorted(res.scalars())
    epoch = s.info.get(EPOCH)
    row = event_row(job_id=0, at=now, actor=actor, src=src, dst=to, reason=reason) | {"epoch": epoch}
    event = select(
        Job.id,
        *(literal(row[k], type_=JobEvent.__table__.c[k].type) for k in _EVENT_COLUMNS),
    )
    for at in range(0, len(ids), _CHUNK):  # insert-from-select: 3x faster than rows of values
        s.execute(
            insert(JobEvent).from_select(
                ["job_id", *_EVENT_COLUMNS], event.where(Job.id.in_(ids[at : at + _CHUNK]))
            )
        )
    return ids


_ROUNDS = 4
"""Rounds of ``cancel_waiting``'s statements at most (PostgreSQL: jobs moved between
PENDING and HELD by concurrent writers escape one round)."""


def cancel_waiting(s: Session, conds: Sequence[ColumnElement[bool]], *, actor: str, now: float) -> list[int]:
    """Cancel every matched waiting job (``jobs.cancel``'s values: ended now); the
    scheduler is woken after the commit (what it may place changed).

    A statement per waiting state, again while a matched job still waits (a few rounds
    at most): on PostgreSQL (read committed) a job that a concurrent hold and release
    moved PENDING -> HELD -> PENDING while the statements waited for its row lock is
    matched by neither, and a cancel of an array racing them cancelled none of it. Each
    statement sees the commits before it; the jobs this transaction cancelled are
    locked, so the others are caught in the next round. On SQLite (one writer) one
    round always does. Jobs still waiting after the last round are the caller's
    (``jobs.cancel_many`` cancels them one by one)."""
    ids: list[int] = []
    for _ in range(_ROUNDS):
        for src in WAITING:
            ids += move_all(
                s,
                conds,
                src,
                JobState.CANCELLED,
                actor=actor,
                reason=f"cancelled by {actor}",
                now=now,
                values={"ended_at": now},
            )
        if (
            s.scalar(select(Job.id).where(*conds, Job.state.in_([str(st) for st in WAITING])).limit(1))
            is None
        ):
            break
    if ids:
        effects.wake_scheduler(s)
    return sorted(ids)


def hold_waiting(s: Session, conds: Sequence[ColumnElement[bool]], *, actor: str, now: float) -> list[int]:
    """Hold every matched PENDING job (a held job frees nothing: no wake-up)."""
    return move_all(
        s,
        conds,
        JobState.PENDING,
        JobState.HELD,
        actor=actor,
        reason=f"held by {actor}",
        now=now,
        values={"wait_reason": f"JobHeldUser: held by {actor}"},
    )


def release_held(s: Session, conds: Sequence[ColumnElement[bool]], *, actor: str, now: float) -> list[int]:
    """Release every matched HELD job; the scheduler is woken after the commit."""
    ids = move_all(
        s,
        conds,
        JobState.HELD,
        JobState.PENDING,
        actor=actor,
        reason=f"released by {actor}",
        now=now,
        values={"wait_reason": None},
    )
    if ids:
        effects.wake_scheduler(s)
    return ids


# -- the service: one transaction each -----------------------------------------------------------


def hold_many(*, db: Database, actor: Principal, match: Match, now: float) -> JobsChanged | Failure:
    """``scontrol hold`` of every matched PENDING job (an array, a user's...); the
    other live ones are skipped."""
    return _each_state(db, actor, match, lambda s, c: hold_waiting(s, c, actor=actor.name, now=now))


def release_many(*, db: Database, actor: Principal, match: Match, now: float) -> JobsChanged | Failure:
    """``scontrol release`` of every matched HELD job; the other live ones are skipped."""
    return _each_state(db, actor, match, lambda s, c: release_held(s, c, actor=actor.name, now=now))


def update_many(
    *, db: Database, actor: Principal, match: Match, spec: JobUpdate, now: float
) -> JobsChanged | Failure:
    """``scontrol update`` of every matched live job (``jobs.update``'s rules, each a
    statement per state): a time limit (for a plain user only on the jobs where it
    goes down; the others are skipped), a name, held (PENDING ones held) or released
    (HELD ones released). A job that cannot take the change is skipped."""
    if spec.time_limit is None and spec.name is None and spec.held is None:
        return invalid("say what to change: time_limit, name or held")
    limit = time_limit(spec.time_limit)
    if isinstance(limit, Failure):
        return limit
    values: dict[str, Any] = {}
    said: list[str] = []
    extra: list[ColumnElement[bool]] = []
    if limit is not None:
        values["time_limit_s"] = limit
        said.append(f"time limit -> {format_duration(limit)}")
        if not actor.is_operator:
            extra.append(or_(Job.time_limit_s.is_(None), Job.time_limit_s >= limit))
    if spec.name is not None:
        values["name"] = spec.name
        said.append(f"name -> {spec.name!r}")

    def change(s: Session, conds: list[ColumnElement[bool]]) -> list[int]:
        conds = [*conds, *extra]
        ids: list[int] = []
        for src in _update_order(spec.held):
            to, more, why = src, dict(values), list(said)
            if spec.held is True and src == JobState.PENDING:
                to, more["wait_reason"] = JobState.HELD, f"JobHeldUser: held by {actor.name}"
                why.append("held")
            elif spec.held is False and src == JobState.HELD:
                to, more["wait_reason"] = JobState.PENDING, None
                why.append("released")
            elif (spec.held is True and src != JobState.HELD) or not values:
                continue  # held asked of a job that runs (refused), or nothing to change here
            reason = f"{'; '.join(why)} by {actor.name}"
            ids += move_all(s, conds, src, to, actor=actor.name, reason=reason, now=now, values=more)
        effects.wake_scheduler(s)
        return sorted(ids)

    return _each_state(db, actor, match, change)


def _update_order(held: bool | None) -> tuple[JobState, ...]:
    """The states ``update_many`` changes, one statement each, in this order: the state a
    job is moved to before the one it leaves (held: HELD, then PENDING -> HELD), so no
    job is matched twice in the transaction (two events, its id twice in ``changed``)."""
    waiting = (JobState.HELD, JobState.PENDING) if held is True else (JobState.PENDING, JobState.HELD)
    return (*waiting, JobState.SCHEDULED, JobState.RUNNING)


def _each_state(
    db: Database,
    actor: Principal,
    match: Match,
    change: Callable[[Session, list[ColumnElement[bool]]], list[int]],
) -> JobsChanged | Failure:
    """``change`` on the match in one transaction; the matched live jobs it did not
    change are the skipped ones."""
    conds = where(actor, match)
    if isinstance(conds, Failure):
        return conds
    with db.write() as s:
        changed = change(s, conds)
        live = matching(s, conds, [JobState(st) for st in LIVE])
    done = set(changed)
    return JobsChanged(changed=changed, skipped=[i for i in live if i not in done])
