"""When failed jobs make a node suspect (issue 34): a pure rule, no database, no clock.

A failed job whose output matched a signature that blames the node (``gpufleet.
diagnosis``: a GPU off the bus, an ECC error, an InfiniBand completion error) is one
piece of evidence against the node that ran it. One user's jobs are one voice, however
many (a user who prints an XID line in a loop cordons nothing by themself): the node
is cordoned once the same signature is found in failed jobs of at least ``users``
distinct users within ``window_s``. Evidence that cordoned it is spent: after an
operator uncordons, it takes as many fresh users again. ``users`` 0 never cordons
(the evidence is still recorded and shown as fleet events).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufleet.diagnosis import Signature, table


@dataclass(frozen=True, slots=True, kw_only=True)
class SuspicionRule:
    users: int = 3
    """Distinct users whose failed jobs carry the signature (0: never cordon)."""
    window_s: float = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DiagnosisConfig:
    """``ServerConfig.diagnosis``: the signature table and the suspicion rule."""

    signatures: tuple[Signature, ...] = field(default_factory=table)
    suspicion: SuspicionRule = field(default_factory=SuspicionRule)
    budget_s: float = 0.5
    """Matching one failed attempt's tail stops after this (``diagnosis.diagnose``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    job_id: int
    user_id: int
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    users: int
    """Distinct users within the window."""
    jobs: tuple[int, ...]
    """The evidence's jobs within the window, oldest first."""
    cordon: bool


def judge(evidence: Sequence[Evidence], rule: SuspicionRule, now: float) -> Judgement:
    """What the unspent evidence of one signature on one node says now."""
    recent = sorted(
        (e for e in evidence if now - rule.window_s <= e.at <= now), key=lambda e: (e.at, e.job_id)
    )
    users = len({e.user_id for e in recent})
    return Judgement(
        users=users,
        jobs=tuple(e.job_id for e in recent),
        cordon=rule.users > 0 and users >= rule.users,
    )
