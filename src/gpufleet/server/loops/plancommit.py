"""The scheduling pass's writes (steps 1 and 4 of ``scheduling.py``), in the one
transaction of a pass: jobs past their time limit -> TIMEOUT (the server's clock rules;
the agent is told to stop them through the sync reply and ``stopping_on`` waits for its
confirmation; a SCHEDULED job's limit starts when it is confirmed RUNNING), then the
plan: starts (PENDING -> SCHEDULED + allocations, their agents touched), preemptions
(-> PREEMPTED -> PENDING, GPU-seconds kept, old nodes told to stop; or, for a preemptor
whose victim asked a ``--signal``, after the grace of ``jobstate/preemption.py``, its
start and any on those GPUs left out of this plan), the waiting jobs
the read cancels, the pending statuses (position, estimated start, reason) and what the
plan does to reservations (``reservations.step_reservations``). Every job write is a
compare-and-set on (state, version) (``transitions.move``): a lost one raises
``Conflict`` and the pass rolls back and reads again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.placefmt import placed_reason
from gpufleet.scheduler import Placement, Plan
from gpufleet.server.jobstate.preemption import Victim, begin_grace, graces, stop_now
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import move, ref, release_attempt
from gpufleet.server.loops.reservations import step_reservations
from gpufleet.server.loops.snapshot import Loaded
from gpufleet.server.store.dispatch import touch
from gpufleet.server.store.models import Allocation, Job, ServiceRow

ACTOR = "scheduler"


def time_out(s: Session, now: float) -> int:
    """Step 1: RUNNING jobs past ``started_at + time_limit_s`` -> TIMEOUT (how many)."""
    q = select(Job).where(
        Job.state == str(JobState.RUNNING),
        Job.time_limit_s.is_not(None),
        Job.started_at.is_not(None),
        Job.started_at + Job.time_limit_s <= now,
    )
    n = 0
    for job in s.scalars(q):
        vals = release_attempt(s, job, now=now, confirmed=False)
        reason = f"time limit {job.time_limit_s:g}s reached"
        move(s, ref(job), JobState.TIMEOUT, actor=ACTOR, reason=reason, now=now, values=vals)
        n += 1
    return n


@dataclass(slots=True)
class _StatusCache:
    """Last written PendingStatus per job, so a pass writes only what changed."""

    rows: dict[int, tuple[int | None, float | None, str | None]] = field(default_factory=dict)


class PlanWriter:
    """Commits each pass's plan; one per scheduling loop (the statuses it last wrote are
    this loop's own)."""

    def __init__(self, *, idle_release_s: float, max_grace_s: float = 120.0) -> None:
        self.idle_release_s = idle_release_s
        """A reservation idle this long is released (``reservations.step_reservations``)."""
        self.max_grace_s = max_grace_s
        """The longest grace a preempted job's ``--signal`` gets (``jobstate/preemption.py``)."""
        self._statuses = _StatusCache()

    def forget(self) -> None:
        """Write every pending status again next time (an attempt was rejected)."""
        self._statuses.rows.clear()

    def commit(self, s: Session, loaded: Loaded, result: Plan, now: float) -> int:
        """Step 4: the plan's preemptions, starts and cancellations, the pending statuses
        and the reservations' step; how many jobs started."""
        held, waiting = self._preempt(s, loaded, result, now) if result.preemptions else (set(), set())
        allocs: list[dict[str, Any]] = []
        models = {n.name: n.gpus[0].model for n in loaded.snapshot.fleet.nodes if n.gpus and result.starts}
        for st in result.starts:
            if waiting and (st.job_id in waiting or _on(st.placement, held)):
                continue  # its GPUs are a victim's until its grace ends (``jobstate/preemption.py``)
            jref = loaded.refs[st.job_id]
            first = st.placement[0]  # one model per node, per job
            vals: dict[str, Any] = {
                "scheduled_at": now,
                "queue_position": None,
                "estimated_start": None,
                "wait_reason": None,
            }
            if first.gpus:  # cost accrues from here (``ledger.py``) at the price of this model
                vals |= {"accrued_to": now, "charge_model": models[first.node]}
            move(
                s,
                jref,
                JobState.SCHEDULED,
                actor=ACTOR,
                reason=placed_reason(
                    [(mig.physical_node(p.node), p.gpus) for p in st.placement], how=result.policy
                ),
                now=now,
                values=vals,
            )
            allocs += [
                {"job_id": jref.id, "node": mig.physical_node(p.node), "gpu_index": g}
                for p in st.placement
                for g in (p.gpus or (None,))  # a 0-GPU job: one row for its node
            ]
            self._statuses.rows.pop(jref.id, None)
        for jid, why in loaded.kill.items():
            ended = {"ended_at": now}
            move(s, loaded.refs[str(jid)], JobState.CANCELLED, actor=ACTOR, reason=why, now=now, values=ended)
            self._statuses.rows.pop(jid, None)
        if allocs:
            s.execute(insert(Allocation), allocs)
            touch(s, {a["node"] for a in allocs})  # their agents learn at the commit (``dispatch.py``)
        self._write_statuses(s, result, now)
        step_reservations(
            s,
            booked=loaded.booked,
            running=loaded.snapshot.running,
            moves=result.reservation_moves,
            now=now,
            idle_release_s=self.idle_release_s,
            actor=ACTOR,
        )
        return len(result.starts)

    def _preempt(
        self, s: Session, loaded: Loaded, result: Plan, now: float
    ) -> tuple[set[tuple[str, int]], set[str]]:
        """The plan's preemptions, at once or after a grace (``jobstate/preemption.py``):
        the GPUs (core node, index) of victims that stay for a grace, and the preemptors
        that wait for them."""
        services = _services_of(s, {int(p.by) for p in result.preemptions if p.by.isdigit()})
        victims: list[Victim] = []
        for pre in result.preemptions:
            jref = loaded.refs[pre.job_id]
            job = s.get(Job, jref.id)
            assert job is not None
            why = pre.reason + services.get(pre.by, "")
            victims.append(Victim(job=job, jref=jref, by=pre.by, reason=why))
        by = {p.by for p in result.preemptions}
        waits = graces(victims, {p.id for p in loaded.snapshot.pending if p.id in by}, self.max_grace_s)
        placements = {rj.job.id: rj.placement for rj in loaded.snapshot.running} if waits else {}
        held: set[tuple[str, int]] = set()
        for v in victims:
            grace = waits.get(v.by)
            if grace is not None and v.job.state == JobState.RUNNING:
                begin_grace(s, v, until=now + grace, actor=ACTOR, now=now)
                held.update((p.node, g) for p in placements.get(str(v.job.id), ()) for g in p.gpus)
            else:
                stop_now(s, v, actor=ACTOR, now=now)
        return held, set(waits)

    def _write_statuses(self, s: Session, result: Plan, now: float) -> None:
        rows: list[dict[str, Any]] = []
        last = self._statuses.rows
        views = [
            (
                int(p.job_id),
                p.position,
                None if p.estimated_start is None else round(p.estimated_start, 1),
                p.reason,
            )
            for p in result.pending
        ]
        for jid, pos, eta, reason in views:
            val = (pos, eta, reason[:512])
            old = last.get(jid)
            if old != val and not (old is not None and old[0::2] == val[0::2] and same_eta(old[1], eta, now)):
                rows.append(
                    {"id": jid, "queue_position": val[0], "estimated_start": val[1], "wait_reason": val[2]}
                )
                last[jid] = val
        if rows:
            # Positions are advisory and not part of the CAS: they do not bump the version.
            s.execute(update(Job), rows)


ETA_SLACK_S = 5.0
ETA_SLACK_SHARE = 0.02


def same_eta(old: float | None, new: float | None, now: float) -> bool:
    """Whether an estimated start moved too little to write again: by at most 2 % of
    the wait it announced, and at least 5 s. Estimates behind a running job that is past
    its predicted end (``scheduler/estimate.expected_end``: never before now) move with
    the clock at every pass; rewriting every waiting job's row for that was most of a
    pass with thousands waiting (``bench/bench_pass_history.py``)."""
    if old is None or new is None:
        return old is new
    return abs(new - old) <= max(ETA_SLACK_S, ETA_SLACK_SHARE * (old - now))


def _on(placement: Placement, held: set[tuple[str, int]]) -> bool:
    """Whether ``placement`` takes a GPU of ``held``."""
    return any((p.node, g) in held for p in placement for g in p.gpus)


def _services_of(s: Session, job_ids: set[int]) -> dict[str, str]:
    """For preemptions by replicas of inference services: job id -> what to add to the
    victim's reason (``; a replica of service NAME``), so the plan says why."""
    if not job_ids:
        return {}
    q = (
        select(Job.id, ServiceRow.name)
        .join(ServiceRow, ServiceRow.id == Job.service_id)
        .where(Job.id.in_(job_ids))
    )
    return {str(jid): f"; a replica of service {name}" for jid, name in s.execute(q)}
