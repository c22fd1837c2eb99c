"""Licenses (Slurm's ``Licenses=`` in slurm.conf): operators declare a count per name
(``gpufleet admin license set NAME COUNT``); a job names what it needs (``-L name:N``),
is refused at submission for a name never declared or more than the count, and waits
(reason ``Licenses``) while running jobs hold them (``scheduler/licenses.py``)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.licenses import LicenseIn, LicenseList, LicenseOut
from gpufleet.server.jobstate.states import ACTIVE
from gpufleet.server.problems import Failure, forbidden, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Job, LicenseRow


def used(s: Session) -> dict[str, int]:
    """License -> what running (and scheduled) jobs hold."""
    out: dict[str, int] = {}
    q = select(Job.licenses).where(Job.state.in_([str(a) for a in ACTIVE]), Job.licenses.is_not(None))
    for (held,) in s.execute(q):
        for name, n in (held or {}).items():
            out[name] = out.get(name, 0) + int(n)
    return out


def list_licenses(*, db: Database, actor: Principal) -> LicenseList:
    with db.read() as s:
        held = used(s)
        rows = s.scalars(select(LicenseRow).order_by(LicenseRow.name))
        return LicenseList(
            items=[LicenseOut(name=r.name, count=r.count, used=held.get(r.name, 0)) for r in rows]
        )


def set_license(*, db: Database, actor: Principal, name: str, spec: LicenseIn) -> LicenseOut | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins declare licenses")
    with db.write() as s:
        row = s.get(LicenseRow, name)
        if row is None:
            row = LicenseRow(name=name)
            s.add(row)
        row.count = spec.count
        s.flush()
        return LicenseOut(name=name, count=row.count, used=used(s).get(name, 0))


def delete_license(*, db: Database, actor: Principal, name: str) -> LicenseOut | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins declare licenses")
    with db.write() as s:
        row = s.get(LicenseRow, name)
        if row is None:
            return not_found(f"no license {name}")
        out = LicenseOut(name=name, count=row.count, used=used(s).get(name, 0))
        s.delete(row)
        return out
