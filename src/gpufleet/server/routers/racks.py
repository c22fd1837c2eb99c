"""Rack power budgets: ``GET /racks``, ``PUT|DELETE /racks/{rack}``; power figures over
the scheduler's defaults: ``GET|PUT /power-figures``, ``DELETE /power-figures/{kind}/{name}``
(``services/racks.py``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path

from gpufleet.api.racks import PowerFigureIn, PowerFigureList, PowerFigureOut, RackIn, RackList, RackOut
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.services import racks

router = APIRouter(prefix="/racks", tags=["racks"])
figures = APIRouter(prefix="/power-figures", tags=["racks"])
RackName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="a rack's name")]


@router.get("", response_model=RackList)
def list_racks(parts: PartsDep, me: Me) -> RackList:
    return racks.list_racks(db=parts.db, actor=me, now=parts.now())


@router.put("/{rack}", response_model=RackOut)
def set_rack(rack: RackName, spec: RackIn, parts: PartsDep, me: Me) -> RackOut:
    return unwrap(racks.set_rack(db=parts.db, actor=me, rack=rack, spec=spec, now=parts.now()))


@router.delete("/{rack}", response_model=RackOut)
def unset_rack(rack: RackName, parts: PartsDep, me: Me) -> RackOut:
    return unwrap(racks.unset_rack(db=parts.db, actor=me, rack=rack, now=parts.now()))


@figures.get("", response_model=PowerFigureList)
def list_figures(parts: PartsDep, me: Me) -> PowerFigureList:
    return racks.list_figures(db=parts.db, actor=me)


@figures.put("", response_model=PowerFigureOut)
def set_figure(spec: PowerFigureIn, parts: PartsDep, me: Me) -> PowerFigureOut:
    return unwrap(racks.set_figure(db=parts.db, actor=me, spec=spec))


@figures.delete("/{kind}/{name}", response_model=PowerFigureOut)
def unset_figure(kind: Literal["model", "node"], name: str, parts: PartsDep, me: Me) -> PowerFigureOut:
    return unwrap(racks.unset_figure(db=parts.db, actor=me, kind=kind, name=name))
