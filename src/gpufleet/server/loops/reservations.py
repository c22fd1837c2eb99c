"""Reservations, the scheduling pass's part: what a pass reads of the BOOKED
reservations (``load_booked``, their core form for ``plan()``) and what it writes back
in its own transaction (``step_reservations``): the plan's moves, when each was last
used, and the release of an active reservation no owner job used for
``--reservation-idle-release``. Booking, listing and cancelling are the service's
(``services/reservations.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from gpufleet.scheduler import Reservation, ReservationMove, RunningJob
from gpufleet.server.services.reservations import (
    BOOKED,
    RELEASED,
    booked_rows,
    event_row,
    to_core,
    where_text,
)
from gpufleet.server.store.models import ReservationEvent, ReservationRow
from gpufleet.timefmt import format_duration


@dataclass(frozen=True, slots=True, kw_only=True)
class Booked:
    """A BOOKED reservation as the pass loaded it (for its CAS writes)."""

    core: Reservation
    version: int
    last_used_at: float | None
    node_map: tuple[tuple[str, int], ...]


def load_booked(s: Session, now: float) -> list[Booked]:
    return [
        Booked(
            core=to_core(r),
            version=r.version,
            last_used_at=r.last_used_at,
            node_map=tuple((str(n), int(c)) for n, c in r.node_map),
        )
        for r in booked_rows(s, after=now)
    ]


def _used(b: Booked, running: Sequence[RunningJob]) -> bool:
    nodes = {n for n, _ in b.node_map}
    return any(b.core.owns(rj.job) and any(p.node in nodes for p in rj.placement) for rj in running)


def step_reservations(
    s: Session,
    *,
    booked: Sequence[Booked],
    running: Sequence[RunningJob],
    moves: Sequence[ReservationMove],
    now: float,
    idle_release_s: float,
    actor: str,
) -> int:
    """Inside the pass's commit: apply the plan's reservation moves, mark used ones,
    release active ones no owner job used for ``idle_release_s``. Each write is a CAS on
    the version; a row that changed meanwhile is skipped (the next pass sees it fresh).
    Returns how many were released."""
    by_id = {b.core.id: b for b in booked}
    moved: dict[str, dict[str, int]] = {}
    for m in moves:
        b = by_id.get(m.reservation)
        if b is None:
            continue
        nm = moved.setdefault(m.reservation, dict(b.node_map))
        nm[m.from_node] = nm.get(m.from_node, 0) - m.gpus
        nm[m.to_node] = nm.get(m.to_node, 0) + m.gpus
    released = 0
    events: list[dict[str, Any]] = []
    for b in booked:
        vals: dict[str, Any] = {}
        rid = int(b.core.id)
        if b.core.id in moved:
            vals["node_map"] = [[n, c] for n, c in moved[b.core.id].items() if c > 0]
            events.append(event_row(rid, now, actor, "moved", where_text(vals["node_map"])))
        if b.core.active(now) and not b.core.maintenance:
            if _used(b, running):
                if b.last_used_at is None or now - b.last_used_at >= min(60.0, idle_release_s / 4):
                    vals["last_used_at"] = now
            elif now - max(b.core.start, b.last_used_at or b.core.start) >= idle_release_s:
                reason = f"released: no job of its owners used it for {format_duration(idle_release_s)}"
                vals |= {"state": RELEASED, "reason": reason}
                events.append(event_row(rid, now, actor, "released", reason))
        if not vals:
            continue
        done = s.execute(
            update(ReservationRow)
            .where(
                ReservationRow.id == rid, ReservationRow.version == b.version, ReservationRow.state == BOOKED
            )
            .values(version=b.version + 1, **vals)
        )
        if done.rowcount != 1:  # type: ignore[attr-defined]
            events = [e for e in events if e["reservation_id"] != rid]
            continue
        released += vals.get("state") == RELEASED
    if events:
        s.execute(insert(ReservationEvent), events)
    return released
