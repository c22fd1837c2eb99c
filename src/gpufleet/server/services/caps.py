"""Per-user caps: queued jobs, booked reservations, live API tokens.

What one user may *hold*, where the rate limits (``ratelimit.py``) bound how fast they
ask: without a cap, one user's 13,000 reservations made every scheduling pass 8x
slower. The anchors are Slurm's association limits (``MaxSubmitJobsPerUser``) and
Kubernetes' ResourceQuota object counts; decisions where they are silent:

* A cap refuses with 403 and says the cap, how many the user has and what to do
  (Kubernetes answers an exceeded quota with 403 Forbidden; 429 would invite a retry
  that cannot succeed until the user acts).
* Caps apply to plain users. Operators and admins are exempt: they run the fleet's own
  tooling (trace replays, the demo, maintenance bookings) and are few and trusted, as
  Slurm's operators and administrators may exceed association limits. A cap counts
  what a user *owns*: an admin creating a token for a user counts against that user.
* Queued jobs are PENDING or HELD (what waits; running jobs are already bounded by
  GPUs and quotas). Reservations are BOOKED ones that have not ended (booked or
  active). Tokens are API tokens not revoked nor expired (node credentials and the fleet
  page's sessions are not API tokens).
* A cap of 0 (``--max-pending-jobs 0``...) is no cap.

Reservations and tokens are counted in the transaction that adds them. Submissions
are the hot path (group commit, many per batch): ``PendingCounts`` keeps each user's
count from the database, adds what it accepts, and reads the database again before it
refuses and at least every ``refresh_s``; so a refusal is always against the database,
and a second API process's submissions are seen within ``refresh_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpufleet.server.config import Caps
from gpufleet.server.problems import Failure, forbidden
from gpufleet.server.store.models import Job, ReservationRow, Token

QUEUED = ("PENDING", "HELD")


def _count_queued(s: Session, user_id: int) -> int:
    q = select(func.count()).select_from(Job).where(Job.user_id == user_id, Job.state.in_(QUEUED))
    return int(s.scalar(q) or 0)


@dataclass(slots=True)
class PendingCounts:
    """Queued jobs per user for the submit path (see the module docstring)."""

    cap: int
    refresh_s: float = 5.0
    now: Callable[[], float] = time.monotonic
    _seen: dict[int, tuple[int, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, s: Session, *, user_id: int, name: str, role: str, jobs: int = 1) -> Failure | None:
        """None: ``jobs`` more jobs of this user's (an array's tasks) are accepted (and
        counted); else the problem. Call it last, for a job nothing else refuses."""
        if self.cap <= 0 or not Caps.applies(role):
            return None
        t = self.now()
        with self._lock:
            count, at = self._seen.get(user_id, (0, float("-inf")))
            fresh = t - at <= self.refresh_s
            if not fresh or count + jobs > self.cap:
                count, at = _count_queued(s, user_id), t
            if count + jobs > self.cap:
                self._seen[user_id] = (count, at)
                what = "" if jobs == 1 else f" (this array adds {jobs})"
                return forbidden(
                    f"pending-jobs cap: {name} has {count} pending or held jobs{what} and the cap is "
                    f"{self.cap} a user; cancel some or wait for them to start"
                )
            self._seen[user_id] = (count + jobs, at)
            return None


def reservations_problem(
    s: Session, *, caps: Caps, user_id: int, name: str, role: str, adding: int, now: float
) -> Failure | None:
    if caps.reservations <= 0 or not Caps.applies(role):
        return None
    q = select(func.count()).select_from(ReservationRow)
    q = q.where(ReservationRow.owner_id == user_id, ReservationRow.state == "BOOKED")
    q = q.where(ReservationRow.end > now)
    have = int(s.scalar(q) or 0)
    if have + adding <= caps.reservations:
        return None
    asked = f"{adding} more windows asked" if adding > 1 else "one more asked"
    return forbidden(
        f"reservation cap: {name} has {have} booked or active reservations and the cap is "
        f"{caps.reservations} a user ({asked}); cancel some first"
    )


def tokens_problem(
    s: Session, *, caps: Caps, user_id: int, name: str, role: str, now: float | None = None
) -> Failure | None:
    """Counts API tokens that still work: not revoked and, with ``now``, not expired.
    The fleet page's sessions are not API tokens: they last hours and are made only
    from an API token."""
    if caps.tokens <= 0 or not Caps.applies(role):
        return None
    q = select(func.count()).select_from(Token)
    q = q.where(Token.user_id == user_id, Token.revoked_at.is_(None), Token.kind != "session")
    if now is not None:
        q = q.where(or_(Token.expires_at.is_(None), Token.expires_at > now))
    have = int(s.scalar(q) or 0)
    if have < caps.tokens:
        return None
    return forbidden(
        f"token cap: {name} has {have} live API tokens and the cap is {caps.tokens} a user; "
        "revoke one first (gpufleet tokens revoke ID)"
    )
