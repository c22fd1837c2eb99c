"""A submission checked against the accounts and records of its transaction: its team,
what it may claim (a priority, a reservation), the jobs it depends on, its QOS and its
licenses.

What a submission may claim (403 otherwise), after Slurm, where only operators raise a
priority and only a reservation's users and accounts run in it:

- a priority above 0: operators and admins only, as for ``jobs.set_priority``; 0 or
  below (being nice to others) is anyone's;
- a reservation: its listed users and the members of its team; operators and admins
  may run anything in any reservation (to test or rescue it). Its owner is not
  implicitly one of them: booking for a team or other users leaves the owner out
  unless listed (the scheduler's ``Reservation.owns`` reads the same lists). Checked
  at submission, like Slurm; a later change of membership does not evict a job.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from gpufleet.api.jobs import JobSubmit
from gpufleet.server.problems import Failure, forbidden, invalid
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.submitbatch import Lookups, NewJob
from gpufleet.server.store.models import Job, ReservationRow, Team


def priority_problem(actor: Principal, spec: JobSubmit) -> Failure | None:
    """A priority above 0 is an operator's to give (see the module's docstring)."""
    if spec.priority > 0 and not actor.is_operator:
        return forbidden(
            f"priority {spec.priority}: only operators and admins give a job a priority above 0 "
            "(0 or below is anyone's)"
        )
    return None


def team_for(ctx: Lookups, actor: Principal, team: str | None) -> tuple[int, str] | Failure:
    mine = ctx.teams.get(actor.user_id, {})
    if team is None:  # Slurm's rule: the user's default account, else the only one
        default = ctx.defaults.get(actor.user_id)
        if default is not None and default in mine:
            return mine[default], default
        if len(mine) == 1:
            name, tid = next(iter(mine.items()))
            return tid, name
        if not mine:
            return invalid(
                "team: you belong to no team; an admin adds you to one (gpufleet admin add-member)"
            )
        return invalid(
            f"team: you belong to teams {', '.join(sorted(mine))} and have no default team: pass one "
            "(--team), or set your default (gpufleet default-team TEAM)"
        )
    if team in mine:
        return mine[team], team
    if actor.is_admin:
        found = ctx.s.scalar(select(Team.id).where(Team.name == team))
        if found is not None:
            return found, team
        return invalid(f"team: no team {team}")
    return forbidden(f"you are not a member of team {team}")


def reservation_problem(ctx: Lookups, new: NewJob) -> Failure | None:
    """A job may name only a booked reservation that has not ended, and only one of its
    people may (see the module's docstring): the scheduler places a job that names a
    reservation in it, whoever submitted it."""
    rid = new.spec.reservation
    if rid is None:
        return None
    row = ctx.s.get(ReservationRow, rid)
    if row is None or row.state != "BOOKED" or row.end <= new.now:
        return invalid(f"reservation: no booked reservation {rid} that has not ended")
    who = new.actor
    if who.is_operator or who.name in row.users:
        return None
    if row.team is not None and row.team in ctx.teams.get(who.user_id, {}):
        return None
    people = "its users" + (f" and members of team {row.team}" if row.team is not None else "")
    return forbidden(f"reservation {rid}: only {people} (or an operator) may run jobs in it")


def dependency_problem(ctx: Lookups, new: NewJob) -> Failure | None:
    """Every job a dependency names must exist and be the submitter's own (an operator
    may name anyone's): depending on another user's job would tell its state."""
    dep = new.dependency
    if dep is None:
        return None
    refs = dep.refs
    ids = sorted({r.job for r in refs})
    if not ids:
        return None
    jobs = Job.metadata.tables["jobs"]
    found: dict[int, int] = {}  # job id -> owner
    arrays: dict[tuple[int, int], int] = {}  # (array id, task) -> owner
    rows = ctx.s.connection().execute(
        select(jobs.c.id, jobs.c.user_id, jobs.c.array_job_id, jobs.c.array_task_id).where(
            jobs.c.id.in_(ids) | jobs.c.array_job_id.in_(ids)
        )
    )
    for jid, uid, array, task in rows:
        found[jid] = uid
        if array is not None and task is not None:
            arrays[(array, task)] = uid
    mine = new.actor.user_id
    for r in refs:
        owner = found.get(r.job) if r.task is None else arrays.get((r.job, r.task))
        if owner is None or (owner != mine and not new.actor.is_operator):
            return invalid(f"dependency: no job {r} of yours")
    return None


def with_qos(ctx: Lookups, new: NewJob) -> NewJob | Failure:
    """The job's QOS: the one it names (Slurm's "Invalid qos specification" for one that
    does not exist), else the default QOS, else none."""
    name = new.spec.qos
    if name is None:
        name = next((q for q, default in ctx.qos.items() if default), None)
    elif name not in ctx.qos:
        known = ", ".join(sorted(ctx.qos)) or "none (gpufleet admin qos create)"
        return invalid(f"qos: invalid qos specification: {name} (QOS: {known})")
    if name == new.spec.qos:
        return new
    return dataclasses.replace(new, spec=new.spec.model_copy(update={"qos": name}))


def license_problem(ctx: Lookups, wanted: dict[str, int]) -> Failure | None:
    """Slurm's "Invalid license specification": a license no operator declared, or more
    than there are (the job could never start)."""
    for name, n in sorted(wanted.items()):
        have = ctx.licenses.get(name)
        if have is None:
            known = ", ".join(sorted(ctx.licenses)) or "none (gpufleet admin license set NAME COUNT)"
            return invalid(f"licenses: invalid license specification: {name} (licenses: {known})")
        if n > have:
            return invalid(f"licenses: {name}:{n} is more than there are ({have})")
    return None
