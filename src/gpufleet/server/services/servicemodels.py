"""Hot model load and unload for a service (issue 30; the API in ``api/servicemodels.py``).

A wish is a row (``ServiceModelRow``): the model is wanted ``loaded`` or ``unloaded`` on
every replica. Nothing here calls a replica: the wishes go down to the agents with each
sync (``wishes``, read by ``nodework.desired`` into ``ServiceProbe.models``), and the
agents converge their replicas (``agent/replicamodels.py``) and report each replica's
state up (``Job.model_states``). A wish rings the nodes of the service's replicas
(``dispatch.touch``), so their agents sync at once rather than at their next period.

Who may: exactly as for every other change of a service (``inference.load_active``):
the owner or an operator, 404 for anyone else, 409 while it is being deleted. Every
change is a service event; the audit log records the request as for any write.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.api.servicemodels import MAX_MODELS, ServiceModelOut, Wanted
from gpufleet.server.jobstate.states import ACTIVE
from gpufleet.server.problems import Failure, conflict, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.inference import add_event, load_active, load_service
from gpufleet.server.services.modelwishes import summarize
from gpufleet.server.store import dispatch
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, Job, ServiceModelRow, ServiceRow


def _ring(s: Session, service_id: int) -> None:
    """Ring the nodes of the service's live replicas: their agents sync at once."""
    q = (
        select(Allocation.node)
        .join(Job, Job.id == Allocation.job_id)
        .where(Job.service_id == service_id, Job.state.in_([str(a) for a in ACTIVE]))
        .distinct()
    )
    dispatch.touch(s, list(s.scalars(q)))


def _one(s: Session, row: ServiceRow, model: str) -> ServiceModelOut:
    return next(m for m in summarize(s, row) if m.name == model)


def set_model(
    *, db: Database, actor: Principal, name: str, model: str, wanted: Wanted, now: float
) -> ServiceModelOut | Failure:
    """Want ``model`` loaded (or unloaded) on every replica of the service, those that
    start later included (``PUT``: the same wish again changes nothing)."""
    with db.write() as s:
        row = load_active(s, actor, name)
        if isinstance(row, Failure):
            return row
        wish = s.get(ServiceModelRow, (row.id, model))
        if wish is None:
            count = s.scalar(
                select(func.count()).select_from(ServiceModelRow).where(ServiceModelRow.service_id == row.id)
            )
            if (count or 0) >= MAX_MODELS:
                return conflict(
                    f"service {name} has {MAX_MODELS} model wishes already; forget one"
                    f" (gpufleet service model forget {name} MODEL)"
                )
            wish = ServiceModelRow(
                service_id=row.id, model=model, wanted=wanted, at=now, actor=actor.name[:140]
            )
            s.add(wish)
        elif wish.wanted == wanted:
            return _one(s, row, model)
        else:
            wish.wanted, wish.at, wish.actor = wanted, now, actor.name[:140]
        verb = "load" if wanted == "loaded" else "unload"
        add_event(
            s,
            row.id,
            at=now,
            actor=actor.name,
            kind=f"model-{verb}",
            reason=f"{model}: {wanted} on every replica",
        )
        _ring(s, row.id)
        s.flush()
        return _one(s, row, model)


def forget_model(
    *, db: Database, actor: Principal, name: str, model: str, now: float
) -> ServiceModelOut | Failure:
    """Drop the wish: replicas keep what they have; new ones start as their server
    starts them. 404 when there is no such wish."""
    with db.write() as s:
        row = load_active(s, actor, name)
        if isinstance(row, Failure):
            return row
        wish = s.get(ServiceModelRow, (row.id, model))
        if wish is None:
            return not_found(f"service {name} has no wish for model {model}")
        out = _one(s, row, model)
        s.delete(wish)
        add_event(
            s, row.id, at=now, actor=actor.name, kind="model-forget", reason=f"{model}: no longer converged"
        )
        _ring(s, row.id)
        return out


def list_models(*, db: Database, actor: Principal, name: str) -> list[ServiceModelOut] | Failure:
    with db.read() as s:
        row = load_service(s, actor, name)
        return row if isinstance(row, Failure) else summarize(s, row)


__all__ = ["forget_model", "list_models", "set_model"]
