"""How a rollout reads (``RolloutOut``: a drain rollout's or a driver upgrade's, with
each node's state) and the durations its requests give; shared by ``maintenance.py``
(drain rollouts) and ``upgrades.py`` (driver upgrades)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.maintenance import RolloutNodeOut, RolloutOut
from gpufleet.server.problems import Failure, invalid
from gpufleet.server.store.models import Rollout, RolloutNode
from gpufleet.timefmt import parse_duration

DRAIN_STATES = ("waiting", "draining", "drained", "done")
UPGRADE_STATES = ("waiting", "draining", "upgrading", "verifying", "done", "failed", "skipped")


def seconds(value: str | float, what: str) -> float | Failure:
    try:
        secs = float(value) if isinstance(value, int | float) else parse_duration(value)
    except ValueError as exc:
        return invalid(f"{what}: {exc}")
    if not 0 <= secs <= 30 * 86_400:
        return invalid(f"{what} must be between 0 and 30 days, got {value!r}")
    return secs


def rollout_out(s: Session, ro: Rollout) -> RolloutOut:
    members = list(
        s.scalars(select(RolloutNode).where(RolloutNode.rollout_id == ro.id).order_by(RolloutNode.position))
    )
    upgrade = ro.expect_driver is not None
    states = UPGRADE_STATES if upgrade else DRAIN_STATES
    counts = {k: sum(1 for m in members if m.state == k) for k in states}
    return RolloutOut(
        id=ro.id,
        state=ro.state,
        created_at=ro.created_at,
        created_by=ro.created_by,
        max_unavailable=ro.max_unavailable,
        grace_s=ro.grace_s,
        requeue=ro.requeue,
        reason=ro.reason,
        finished_at=ro.finished_at,
        counts=counts,
        nodes=[
            RolloutNodeOut(
                node=m.node,
                state=m.state,
                started_at=m.started_at,
                finished_at=m.finished_at,
                reason=m.reason,
                driver=m.driver,
                attempt=m.attempt,
            )
            for m in members
        ],
        kind="upgrade" if upgrade else "drain",
        expect_driver=ro.expect_driver,
        hook=ro.hook,
        pause_reason=ro.pause_reason,
    )
