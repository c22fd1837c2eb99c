"""The read side of service model wishes (issue 30; ``servicemodels.py`` writes them):
what the agents are sent (``wishes``) and what ``service show`` says (``summarize``).
Apart from ``servicemodels`` so that ``inference`` and ``nodework`` can read them without
importing the writes (which import ``inference``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.servicemodels import ReplicaModelOut, ServiceModelOut, converged
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.store.models import Job, ServiceModelRow, ServiceRow


def wishes(s: Session, service_ids: Iterable[int]) -> dict[int, dict[str, bool]]:
    """Per service, its wished models: name -> wanted loaded (for the agents)."""
    ids = sorted(set(service_ids))
    out: dict[int, dict[str, bool]] = {}
    if not ids:
        return out
    q = select(ServiceModelRow.service_id, ServiceModelRow.model, ServiceModelRow.wanted).where(
        ServiceModelRow.service_id.in_(ids)
    )
    for sid, model, wanted in s.execute(q):
        out.setdefault(sid, {})[model] = wanted == "loaded"
    return out


def summarize(s: Session, row: ServiceRow) -> list[ServiceModelOut]:
    """Each wish with where the service's serving replicas (running and ready, not
    draining: in rotation or warm) stand with it."""
    rows = list(
        s.scalars(
            select(ServiceModelRow)
            .where(ServiceModelRow.service_id == row.id)
            .order_by(ServiceModelRow.model)
        )
    )
    if not rows:
        return []
    reps = list(
        s.execute(
            select(Job.id, Job.replica, Job.model_states)
            .where(
                Job.service_id == row.id,
                Job.state == str(JobState.RUNNING),
                Job.ready.is_(True),
                Job.draining_at.is_(None),
            )
            .order_by(Job.replica, Job.id)
        )
    )
    return [_summary(w, reps) for w in rows]


def _summary(wish: ServiceModelRow, reps: Sequence[Any]) -> ServiceModelOut:
    per: list[ReplicaModelOut] = []
    for job_id, slot, states in reps:
        got = _state_of(states, wish.model)
        if got is None or got.get("wanted") not in (None, wish.wanted):
            per.append(ReplicaModelOut(job_id=job_id, replica=slot or 0, state="PENDING"))
            continue
        per.append(
            ReplicaModelOut(
                job_id=job_id, replica=slot or 0, state=got["state"], reason=str(got.get("reason") or "")
            )
        )
    return ServiceModelOut(
        name=wish.model,
        wanted=wish.wanted,  # type: ignore[arg-type]
        at=wish.at,
        actor=wish.actor,
        replicas=len(per),
        converged=sum(1 for p in per if converged(wish.wanted, p.state)),
        failed=sum(1 for p in per if p.state in ("FAILED", "UNKNOWN")),
        per_replica=per,
    )


def _state_of(states: Any, model: str) -> dict[str, Any] | None:
    """A replica's reported entry for ``model`` (a stored list of dicts; anything else:
    none)."""
    if not isinstance(states, list):
        return None
    for entry in states:
        if isinstance(entry, dict) and entry.get("name") == model and isinstance(entry.get("state"), str):
            return entry
    return None


__all__ = ["summarize", "wishes"]
