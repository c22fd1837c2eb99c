"""What the fleet page shows of failure diagnosis (issue 34): which nodes are suspect and
why (a marker on the node's tile, in the snapshot the page polls), and a node's last
failed job attempts with what their output matched (the node's detail).

Both are reads of ``job_diagnoses`` (``services/diagnoses.py`` writes them). A node is
*suspect* while failed jobs of at least one user carry a signature that blames the node,
within the suspicion window and not yet spent on a cordon (what ``decide/suspicion.py``
counts); it is *cordoned for it* while it is cordoned and its last node-wide cordon event
is the diagnosis loop's (the event's actor, not its words). Suspicion is rare and the
snapshot is polled every few seconds for the whole fleet, so only suspect nodes carry
it, a few numbers each.

What a job's output said (its name, its owner, the matching line) is its owner's: a plain
user sees those of their own jobs only, as ``GET /v1/jobs`` (the signature, diagnosis and
hint come from the operator's table and are shown to everyone who may see the node). It
is all returned as data; the page sets it as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import false, func, select, true
from sqlalchemy.orm import Session

from gpufleet.api.fleet import NodeFailure, Suspicion
from gpufleet.diagnosis import Signature
from gpufleet.server.decide.suspicion import DiagnosisConfig
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.diagnoses import ACTOR
from gpufleet.server.store.models import GpuEvent, Job, JobDiagnosis, User

FAILURES = 10
"""Failed attempts in a node's detail."""
EVIDENCE_JOBS = 5
LINE_CHARS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    node: str
    signature: str
    user_id: int
    job_id: int
    at: float


def _describe(signatures: Sequence[Signature]) -> dict[str, Signature]:
    return {s.id: s for s in signatures}


def _summary(
    rows: Sequence[_Row], *, config: DiagnosisConfig, known: dict[str, Signature], cordoned: bool
) -> Suspicion | None:
    """The signature with the most distinct users among one node's evidence (ties: the
    latest, then the later job), as a ``Suspicion``."""
    per: dict[str, list[_Row]] = {}
    for r in sorted(rows, key=lambda r: (r.at, r.job_id)):
        per.setdefault(r.signature, []).append(r)
    if not per:
        return None
    sig, evidence = max(
        per.items(), key=lambda kv: (len({r.user_id for r in kv[1]}), kv[1][-1].at, kv[1][-1].job_id)
    )
    jobs = list(dict.fromkeys(r.job_id for r in evidence))
    rule = config.suspicion
    found = known.get(sig)
    return Suspicion(
        signature=sig,
        diagnosis=found.diagnosis if found is not None else "",
        users=len({r.user_id for r in evidence}),
        threshold=rule.users,
        window_s=rule.window_s,
        jobs=jobs[-EVIDENCE_JOBS:],
        cordoned=cordoned,
    )


def _evidence(s: Session, *, since: float, spent: bool, nodes: Iterable[str] | None = None) -> list[_Row]:
    q = select(
        JobDiagnosis.node,
        JobDiagnosis.signature,
        JobDiagnosis.user_id,
        JobDiagnosis.job_id,
        JobDiagnosis.done_at,
    ).where(
        JobDiagnosis.blame == "node",
        JobDiagnosis.signature.is_not(None),
        JobDiagnosis.spent == (true() if spent else false()),  # as ix_job_diagnoses_suspect says it
        JobDiagnosis.done_at >= since,
    )
    if nodes is not None:
        q = q.where(JobDiagnosis.node.in_(list(nodes)))
    return [
        _Row(node=n, signature=sig, user_id=u, job_id=j, at=float(at))
        for n, sig, u, j, at in s.execute(q)
        if sig is not None and at is not None
    ]


def suspicions(
    s: Session, *, now: float, config: DiagnosisConfig, cordoned: Iterable[str]
) -> dict[str, Suspicion]:
    """Node -> why it is suspect, for the suspect nodes only (``cordoned``: the nodes
    cordoned now, whatever for). A node the diagnosis cordoned shows the evidence that
    did it (spent then, within the window before the cordon), whatever came since."""
    known = _describe(config.signatures)
    window = config.suspicion.window_s
    by_node: dict[str, list[_Row]] = {}
    for r in _evidence(s, since=now - window, spent=False):
        by_node.setdefault(r.node, []).append(r)
    out: dict[str, Suspicion] = {}
    for node, rows in by_node.items():
        found = _summary(rows, config=config, known=known, cordoned=False)
        if found is not None:
            out[node] = found
    out.update(_cordoned_by_diagnosis(s, cordoned=list(cordoned), config=config, known=known))
    return out


def _cordoned_by_diagnosis(
    s: Session, *, cordoned: list[str], config: DiagnosisConfig, known: dict[str, Signature]
) -> dict[str, Suspicion]:
    if not cordoned:
        return {}
    last = (
        select(func.max(GpuEvent.id))
        .where(GpuEvent.node.in_(cordoned), GpuEvent.kind == "cordoned", GpuEvent.gpu_index.is_(None))
        .group_by(GpuEvent.node)
    )
    ours = {
        node: at
        for node, at, actor in s.execute(
            select(GpuEvent.node, GpuEvent.at, GpuEvent.actor).where(GpuEvent.id.in_(last.scalar_subquery()))
        )
        if actor == ACTOR
    }
    if not ours:
        return {}
    window = config.suspicion.window_s
    out: dict[str, Suspicion] = {}
    rows = _evidence(s, since=min(ours.values()) - window, spent=True, nodes=ours)
    for node, at in ours.items():
        mine = [r for r in rows if r.node == node and at - window <= r.at <= at]
        if not mine:
            continue
        trigger = max(mine, key=lambda r: (r.at, r.job_id)).signature  # the row that cordoned it
        found = _summary(
            [r for r in mine if r.signature == trigger], config=config, known=known, cordoned=True
        )
        if found is not None:
            out[node] = found
    return out


def node_failures(
    s: Session, *, node: str, actor: Principal, signatures: Sequence[Signature], limit: int = FAILURES
) -> list[NodeFailure]:
    """The node's last ``limit`` failed job attempts whose output it shipped, newest first."""
    known = _describe(signatures)
    q = (
        select(JobDiagnosis, Job.name, Job.user_id, User.name)
        .join(Job, Job.id == JobDiagnosis.job_id)
        .join(User, User.id == Job.user_id)
        .where(JobDiagnosis.node == node)
        .order_by(JobDiagnosis.id.desc())
        .limit(limit)
    )
    out: list[NodeFailure] = []
    for row, name, owner, user in s.execute(q):
        mine = actor.is_operator or owner == actor.user_id
        found = known.get(row.signature) if row.signature is not None else None
        line = (row.line or "") if mine else ""
        out.append(
            NodeFailure(
                job_id=row.job_id,
                attempt=row.attempt,
                name=name if mine else "",
                user=user if mine else "",
                at=row.done_at if row.done_at is not None else row.queued_at,
                pending=row.done_at is None,
                signature=row.signature,
                diagnosis=found.diagnosis if found is not None else "",
                hint=found.hint if found is not None else "",
                blame=row.blame,
                line=line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…",
            )
        )
    return out
