"""Advance reservations: book (admission), list, cancel; and what the scheduling pass
reads and writes about them (snapshot rows, reservation moves, idle reclaim).

Admission runs the pure core's ``admit_reservation`` against the pool's registered fleet
(every node as if up: a reservation is a promise about capacity, not about this minute's
health) and every BOOKED reservation that has not ended, inside one write transaction
that first locks the pool rows involved (``SELECT ... FOR UPDATE``; SQLite's write
transactions are ``BEGIN IMMEDIATE`` already), so two admissions never both take the
same GPUs. A repeat is admitted all-or-nothing.

Visibility: a user sees reservations they own, are a listed user of, or that belong to one
of their teams; only the owner (or an operator/admin) cancels. Operators and admins see
all, and alone may book named nodes (``node_names``) and maintenance windows.

States: BOOKED -> CANCELLED (a person) | RELEASED (reclaimed: started, and no owner job
used it for the server's ``--idle-release``). A BOOKED row past its end is shown as ENDED.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.orm import Session

from gpufleet.api.reservations import ReservationIn, ReservationOut
from gpufleet.scheduler import Fleet, Reservation
from gpufleet.scheduler.reservations import admit_reservation
from gpufleet.server.config import Caps
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.caps import reservations_problem
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import (
    Membership,
    NodeRow,
    Pool,
    ReservationEvent,
    ReservationRow,
    Team,
    User,
)
from gpufleet.server.store.pages import ReservationPage, cut

BOOKED, CANCELLED, RELEASED = "BOOKED", "CANCELLED", "RELEASED"
_STEP = {"daily": timedelta(days=1), "weekly": timedelta(days=7)}


def windows(
    *, start: float, duration_s: float, repeat: str | None, count: int, tz: str
) -> list[tuple[float, float]]:
    """``count`` windows ``[start, end)``; repeats keep the local wall-clock time in ``tz``
    (aware datetime arithmetic is wall-clock arithmetic), so the UTC start shifts by the
    offset change across a daylight-saving boundary. Raises ZoneInfoNotFoundError."""
    zone = ZoneInfo(tz)
    first = datetime.fromtimestamp(start, zone)
    n = count if repeat else 1
    step = _STEP[repeat] if repeat else timedelta(0)
    out = []
    for i in range(n):
        s = (first + i * step).timestamp()
        out.append((s, s + duration_s))
    return out


def _out(r: ReservationRow, owner: str, now: float) -> ReservationOut:
    state = r.state
    if state == BOOKED:
        state = "ENDED" if r.end <= now else "ACTIVE" if r.start <= now else BOOKED
    return ReservationOut(
        id=r.id,
        name=r.name,
        owner=owner,
        team=r.team,
        users=list(r.users),
        pool=r.pool,
        gpu_type=r.gpu_type,
        gpus=r.gpus,
        start=r.start,
        end=r.end,
        nodes=[(str(n), int(c)) for n, c in r.node_map],
        maintenance=r.maintenance,
        state=state,
        reason=r.reason,
        last_used_at=r.last_used_at,
    )


def to_core(r: ReservationRow) -> Reservation:
    return Reservation(
        id=str(r.id),
        start=r.start,
        end=r.end,
        nodes=tuple((str(n), int(c)) for n, c in r.node_map if int(c) > 0),
        users=tuple(r.users),
        team=r.team,
        maintenance=r.maintenance,
    )


def booked_rows(s: Session, *, after: float) -> list[ReservationRow]:
    q = select(ReservationRow).where(ReservationRow.state == BOOKED, ReservationRow.end > after)
    return list(s.scalars(q.order_by(ReservationRow.start, ReservationRow.id)))


def _check_people(s: Session, actor: Principal, spec: ReservationIn) -> Failure | None:
    if (spec.node_names or spec.maintenance) and not actor.is_operator:
        return forbidden("only operators and admins book named nodes or maintenance windows")
    if spec.maintenance and not spec.node_names:
        return invalid("a maintenance reservation names its nodes (node_names)")
    if not spec.node_names and spec.gpus < 1:
        return invalid("gpus must be at least 1")
    if spec.team is not None:
        tid = s.scalar(select(Team.id).where(Team.name == spec.team))
        if tid is None:
            return invalid(f"team: no team {spec.team}")
        member = s.scalar(
            select(Membership.team_id).where(Membership.team_id == tid, Membership.user_id == actor.user_id)
        )
        if member is None and not actor.is_operator:
            return forbidden(f"you are not a member of team {spec.team}")
    if spec.users:
        known = set(s.scalars(select(User.name).where(User.name.in_(spec.users))))
        unknown = sorted(set(spec.users) - known)
        if unknown:
            return invalid(f"users: no user {', '.join(unknown)}")
    return None


def _fleet_for(s: Session, spec: ReservationIn, fleets: FleetCache) -> Fleet | Failure:
    """The pool's registered fleet (and, for named nodes, every pool they are in; the
    pool rows are locked first, in name order, to serialise admissions)."""
    pools = {spec.pool}
    if spec.node_names:
        found = dict(
            s.execute(select(NodeRow.name, NodeRow.pool).where(NodeRow.name.in_(spec.node_names))).all()
        )
        missing = sorted(set(spec.node_names) - set(found))
        if missing:
            return invalid(f"node_names: no node {', '.join(missing)}")
        pools = set(found.values())
    locked = list(
        s.scalars(select(Pool.name).where(Pool.name.in_(sorted(pools))).order_by(Pool.name).with_for_update())
    )
    if not spec.node_names and spec.pool not in locked:
        return invalid(f"pool: no pool {spec.pool}")
    nodes = tuple(n for p in sorted(pools) for n in fleets.registered(s, p).nodes)
    return Fleet(nodes=nodes)


def create(
    *,
    db: Database,
    actor: Principal,
    spec: ReservationIn,
    now: float,
    fleets: FleetCache,
    caps: Caps | None = None,
) -> list[ReservationOut] | Failure:
    """Admit every window of the request or none (409 naming the conflict; 403 past the
    owner's reservation cap, ``services/caps.py``)."""
    try:
        wins = windows(
            start=spec.start,
            duration_s=spec.duration_s,
            repeat=spec.repeat,
            count=spec.count,
            tz=spec.timezone,
        )
    except (ZoneInfoNotFoundError, ValueError) as exc:
        return invalid(f"timezone: unknown time zone {spec.timezone!r} ({exc.__class__.__name__})")
    if wins[-1][1] <= now:
        return invalid("the reservation window is already over")
    users = list(spec.users) if (spec.users or spec.team or spec.maintenance) else [actor.name]
    with db.write() as s:
        problem = _check_people(s, actor, spec)
        fleet = problem or _fleet_for(s, spec, fleets)
        if isinstance(fleet, Failure):
            return fleet
        over = _over_cap(s, caps, actor, len(wins), now)  # counted under the pools' lock
        if over is not None:
            return over
        here = {n.name for n in fleet.nodes}  # other pools' bookings are no conflict
        existing = [r for r in map(to_core, booked_rows(s, after=now)) if any(n in here for n, _ in r.nodes)]
        maps: list[tuple[tuple[str, int], ...]] = []
        for i, (start, end) in enumerate(wins):
            got = admit_reservation(
                fleet,
                existing,
                gpus=spec.gpus,
                start=start,
                end=end,
                gpus_per_node=spec.gpus_per_node,
                nodes=spec.nodes,
                gpu_type=spec.gpu_type,
                pool=spec.pool,
                node_names=spec.node_names,
            )
            if isinstance(got, str):
                which = f"window {i + 1} of {len(wins)} " if len(wins) > 1 else ""
                when = datetime.fromtimestamp(start, ZoneInfo(spec.timezone)).isoformat(timespec="minutes")
                return conflict(f"reservation {which}at {when} refused: {got}")
            maps.append(got)
            existing.append(Reservation(id=f"new-{i + 1}", start=start, end=end, nodes=got))
        rows = [
            ReservationRow(
                name=_window_name(spec.name, actor.name, int(start), i if len(wins) > 1 else None),
                owner_id=actor.user_id,
                team=spec.team,
                users=users if not spec.maintenance else [],
                pool=_pool_of(fleet, m) or spec.pool,
                gpu_type=spec.gpu_type,
                gpus=sum(c for _, c in m),
                start=start,
                end=end,
                node_map=[[n, c] for n, c in m],
                maintenance=spec.maintenance,
                state=BOOKED,
                reason="maintenance" if spec.maintenance else "",
                version=0,
                created_at=now,
            )
            for i, ((start, end), m) in enumerate(zip(wins, maps, strict=True))
        ]
        s.add_all(rows)
        s.flush()
        s.execute(
            insert(ReservationEvent),
            [event_row(r.id, now, actor.name, "booked", where_text(r.node_map)) for r in rows],
        )
        effects.wake_scheduler(s)  # the next pass keeps the window free
        return [_out(r, actor.name, now) for r in rows]


def _over_cap(s: Session, caps: Caps | None, actor: Principal, adding: int, now: float) -> Failure | None:
    if caps is None:
        return None
    return reservations_problem(
        s, caps=caps, user_id=actor.user_id, name=actor.name, role=actor.role, adding=adding, now=now
    )


def _window_name(name: str, owner: str, start: int, index: int | None) -> str:
    """A window's name, within the column's 128 characters: a named repeat's windows are
    ``name#1``, ``name#2``... (the name is cut to leave room for the number)."""
    if not name:
        return f"{owner}-{start}"[:128]
    if index is None:
        return name[:128]
    suffix = f"#{index + 1}"
    return name[: 128 - len(suffix)] + suffix


def _pool_of(fleet: Fleet, node_map: Sequence[tuple[str, int]]) -> str | None:
    pools = {n.pool for n in fleet.nodes if n.name in {name for name, _ in node_map}}
    return pools.pop() if len(pools) == 1 else None


def where_text(node_map: Sequence[Sequence[Any]]) -> str:
    return " ".join(f"{n}:{c}" for n, c in node_map)


def event_row(rid: int, at: float, actor: str, kind: str, reason: str) -> dict[str, Any]:
    return {"reservation_id": rid, "at": at, "actor": actor, "kind": kind, "reason": reason[:512]}


def _my_teams(s: Session, actor: Principal) -> set[str]:
    q = (
        select(Team.name)
        .join(Membership, Membership.team_id == Team.id)
        .where(Membership.user_id == actor.user_id)
    )
    return set(s.scalars(q))


def list_reservations(
    *,
    db: Database,
    actor: Principal,
    now: float,
    include_past: bool,
    limit: int = 100,
    cursor: str | None = None,
) -> ReservationPage | Failure:
    """By start, then id, a page at a time (``pages.py``; the cursor is the last one's
    ``start:id``). Users' filter runs here, not in SQL: ``users`` is a JSON list (no
    portable "contains"), so rows are read in batches until the page is full."""
    after = _after(cursor)
    if isinstance(after, Failure):
        return after
    with db.read() as s:
        q = select(ReservationRow, User.name).join(User, User.id == ReservationRow.owner_id)
        if not include_past:
            q = q.where(ReservationRow.end > now)
        if after is not None:
            start, rid = after
            later = and_(ReservationRow.start == start, ReservationRow.id > rid)
            q = q.where(or_(ReservationRow.start > start, later))
        teams = set() if actor.is_operator else _my_teams(s, actor)
        seen: list[tuple[ReservationRow, str]] = []
        q = q.order_by(ReservationRow.start, ReservationRow.id).execution_options(yield_per=500)
        result = s.execute(q)
        try:
            for r, owner in result:
                mine = r.owner_id == actor.user_id or actor.name in r.users or r.team in teams
                if actor.is_operator or mine:
                    seen.append((r, owner))
                    if len(seen) > limit:
                        break
        finally:
            result.close()
    rows, nxt = cut(seen, limit, lambda row: f"{row[0].start!r}:{row[0].id}")
    return ReservationPage(items=[_out(r, owner, now) for r, owner in rows], next_cursor=nxt)


def _after(cursor: str | None) -> tuple[float, int] | Failure | None:
    if cursor is None:
        return None
    start, _, rid = cursor.rpartition(":")
    try:
        return float(start), int(rid)
    except ValueError:
        return invalid(f"cursor: {cursor!r} is not a cursor this list gave")


def cancel(*, db: Database, actor: Principal, reservation_id: int, now: float) -> ReservationOut | Failure:
    with db.write() as s:
        row = s.get(ReservationRow, reservation_id)
        owner = None if row is None else s.scalar(select(User.name).where(User.id == row.owner_id))
        if row is None or owner is None:
            return not_found(f"no reservation {reservation_id}")
        if not actor.is_operator and row.owner_id != actor.user_id:
            if actor.name in row.users:
                return forbidden(
                    f"reservation {reservation_id} was booked by {owner}: only they or an operator cancel it"
                )
            return not_found(f"no reservation {reservation_id}")
        if row.state != BOOKED or row.end <= now:
            return conflict(
                f"reservation {reservation_id} is {_out(row, owner, now).state}: nothing to cancel"
            )
        done = s.execute(
            update(ReservationRow)
            .where(
                ReservationRow.id == row.id,
                ReservationRow.version == row.version,
                ReservationRow.state == BOOKED,
            )
            .values(state=CANCELLED, reason=f"cancelled by {actor.name}", version=row.version + 1)
        )
        if done.rowcount != 1:  # type: ignore[attr-defined]
            return conflict(f"reservation {reservation_id} changed meanwhile; try again")
        s.execute(insert(ReservationEvent), [event_row(row.id, now, actor.name, "cancelled", "")])
        effects.wake_scheduler(s)  # what it held back may start now
        s.refresh(row)
        return _out(row, owner, now)


# -- the scheduling pass ---------------------------------------------------------------------
