"""Licenses: ``GET /licenses``, ``PUT|DELETE /licenses/{name}`` (``services/licenses.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from gpufleet.api.licenses import LicenseIn, LicenseList, LicenseOut
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.services import licenses

router = APIRouter(prefix="/licenses", tags=["licenses"])
LicenseName = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="a license's name")
]


@router.get("", response_model=LicenseList)
def list_licenses(parts: PartsDep, me: Me) -> LicenseList:
    return licenses.list_licenses(db=parts.db, actor=me)


@router.put("/{name}", response_model=LicenseOut)
def set_license(name: LicenseName, spec: LicenseIn, parts: PartsDep, me: Me) -> LicenseOut:
    return unwrap(licenses.set_license(db=parts.db, actor=me, name=name, spec=spec))


@router.delete("/{name}", response_model=LicenseOut)
def delete_license(name: str, parts: PartsDep, me: Me) -> LicenseOut:
    return unwrap(licenses.delete_license(db=parts.db, actor=me, name=name))
