"""QOS (Slurm's quality of service): admins create, list and delete them; a job names
one (``--qos``) or gets the default one at submission (``submitchecks.with_qos``); the
scheduling loop adds its priority and preemptability to each job's request and hands
its per-user limits to the core (``scheduler/qos.py``).

Creating a QOS that exists replaces it (``sacctmgr modify qos`` and ``add`` in one): an
admin changes a limit by saying the whole QOS again. Deleting one leaves its jobs'
``qos`` as it was: they run without its limits from then on."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.api.qos import QosIn, QosList, QosOut
from gpufleet.server.problems import Failure, forbidden, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import QosRow


def _out(q: QosRow) -> QosOut:
    return QosOut(
        name=q.name,
        priority=q.priority,
        max_gpus_per_user=q.max_gpus_per_user,
        max_jobs_per_user=q.max_jobs_per_user,
        preemptable=q.preemptable,
        default=q.is_default,
        description=q.description,
    )


def list_qos(*, db: Database, actor: Principal) -> QosList:
    """Everyone may read them (``sacctmgr show qos``): they say why a job waits."""
    with db.read() as s:
        return QosList(items=[_out(q) for q in s.scalars(select(QosRow).order_by(QosRow.name))])


def put_qos(*, db: Database, actor: Principal, spec: QosIn) -> QosOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins manage QOS")
    with db.write() as s:
        q = s.get(QosRow, spec.name)
        if q is None:
            q = QosRow(name=spec.name)
            s.add(q)
        q.priority, q.preemptable, q.description = spec.priority, spec.preemptable, spec.description
        q.max_gpus_per_user, q.max_jobs_per_user = spec.max_gpus_per_user, spec.max_jobs_per_user
        q.is_default = spec.default
        s.flush()
        if spec.default:
            _only_default(s, q.name)
        return _out(q)


def _only_default(s: Session, name: str) -> None:
    s.execute(update(QosRow).where(QosRow.name != name, QosRow.is_default).values(is_default=False))


def delete_qos(*, db: Database, actor: Principal, name: str) -> QosOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins manage QOS")
    with db.write() as s:
        q = s.get(QosRow, name)
        if q is None:
            return not_found(f"no QOS {name}")
        out = _out(q)
        s.delete(q)
        return out
