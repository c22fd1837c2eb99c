from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.api.reservations import ReservationIn, ReservationOut
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import ObjectId, unwrap
from gpufleet.server.routers.paging import Cursor, Limit
from gpufleet.server.services import reservations
from gpufleet.server.store.pages import ReservationPage

router = APIRouter(prefix="/reservations", tags=["reservations"])


@router.post("", status_code=201, response_model=list[ReservationOut])
def create(spec: ReservationIn, parts: PartsDep, me: Me) -> list[ReservationOut]:
    """Book one window, or ``count`` repeats (all or none). 409: the conflict, named."""
    return unwrap(
        reservations.create(
            db=parts.db, actor=me, spec=spec, now=parts.now(), fleets=parts.fleets, caps=parts.config.caps
        )
    )


@router.get("", response_model=ReservationPage)
def list_reservations(
    parts: PartsDep,
    me: Me,
    include_past: Annotated[bool, Query(alias="all")] = False,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> ReservationPage:
    """Yours (operators: everyone's) that have not ended; ``?all=true`` adds past ones.
    By start, a page at a time (``pages.py``)."""
    return unwrap(
        reservations.list_reservations(
            db=parts.db, actor=me, now=parts.now(), include_past=include_past, limit=limit, cursor=cursor
        )
    )


@router.delete("/{reservation_id}", response_model=ReservationOut)
def cancel(reservation_id: ObjectId, parts: PartsDep, me: Me) -> ReservationOut:
    return unwrap(reservations.cancel(db=parts.db, actor=me, reservation_id=reservation_id, now=parts.now()))
