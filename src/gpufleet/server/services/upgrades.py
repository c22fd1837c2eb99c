"""Rolling driver upgrades that verify (issue 34): a rollout (``Rollout`` with
``expect_driver``) that, ``max_unavailable`` nodes at a time, cordons and drains a node,
has it upgraded, verifies it and only then uncordons it, as the NVIDIA GPU Operator's
driver upgrade controller and Kubernetes' rolling updates do.

A node's states (``RolloutNode.state``)::

    waiting -> draining -> upgrading -> verifying -> done
                              ^              |
                              +-- failed <---+        (resume: tried again)

- *draining*, batch by batch (``max_unavailable`` nodes, in the order given; the next
  batch once every node of this one is done): ``nodeops.start_drain`` (running jobs
  may finish for the drain timeout, then are requeued; service replicas on it are
  replaced elsewhere first, ``decide/replicas.py``);
- *upgrading*: no job holds the node. With a hook, its agent is ordered (sync reply
  ``upgrade``) to run it; without one, the operator upgrades by hand and presses on
  (``upgrade resume``, or ``node uncordon``);
- *verifying*: the agent checks (the driver it reports, NVML's health of every GPU, a
  smoke kernel on each) and reports; the server judges (``decide/upgrade.py``);
- *done*: passed, the node uncordoned; *failed*: the node stays cordoned, and the whole
  rollout is paused with the reason (no new node is drained; nodes already under way
  finish their own step).

Security: the server never sends a command. It names a hook, and an agent runs only the
hooks its own operator configured on the node (``agent/upgrade.py``): whoever holds an
operator token can make a node run what root put there, never a string of theirs.

Who moves what: the lifecycle loop (``advance``, one node per transaction, and
``finish``), the node's sync (``order_for``, ``record_report``), operators (``start``,
``pause``, ``resume``, ``abort``; ``maintenance.uncordon`` presses on for one node).
Every step is a fleet event (``gpu_events``).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.api.maintenance import RolloutOut
from gpufleet.api.upgrades import ResumeIn, UpgradeIn, UpgradeOrder, UpgradeReport
from gpufleet.server.decide import upgrade as verdict
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.nodeops import add_event, start_drain
from gpufleet.server.services.rolloutview import rollout_out, seconds
from gpufleet.server.store import dispatch, effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, GpuRow, NodeRow, Rollout, RolloutNode

ACTOR = "upgrade"
UNAVAILABLE = ("draining", "upgrading", "verifying", "failed")
"""Members that count against ``max_unavailable`` (a failed node stays out of service)."""
OPEN = ("active", "paused")
"""Rollout states that still hold nodes (and block a new rollout)."""


def _operator(actor: Principal) -> Failure | None:
    return None if actor.is_operator else forbidden("only operators and admins run driver upgrades")


def held_reason(ro: Rollout) -> str:
    """The cordon reason of a node this rollout took out (compared, on success, with the
    node's own: a node someone else cordoned meanwhile stays cordoned)."""
    return f"upgrade rollout {ro.id} to driver {ro.expect_driver}"[:256]


def _event(s: Session, *, now: float, node: str, kind: str, reason: str, severity: str = "info") -> None:
    add_event(s, at=now, node=node, kind=kind, severity=severity, actor=ACTOR, reason=reason)


def _members(s: Session, ro: Rollout) -> list[RolloutNode]:
    return list(
        s.scalars(select(RolloutNode).where(RolloutNode.rollout_id == ro.id).order_by(RolloutNode.position))
    )


def _upgrade(s: Session, rollout_id: int, states: Collection[str] | None = OPEN) -> Rollout | Failure:
    """The driver upgrade ``rollout_id`` if it is in one of ``states`` (None: any), else
    404 (no such upgrade) or 409 (in another state)."""
    ro = s.get(Rollout, rollout_id)
    if ro is None or ro.expect_driver is None:
        return not_found(f"no driver upgrade {rollout_id}")
    if states is not None and ro.state not in states:
        return conflict(f"upgrade {rollout_id} is {ro.state}")
    return ro


# -- operators ------------------------------------------------------------------------------------


def start(*, db: Database, actor: Principal, spec: UpgradeIn, now: float) -> RolloutOut | Failure:
    if (bad := _operator(actor)) is not None:
        return bad
    grace = seconds(spec.drain_timeout, "drain_timeout")
    if isinstance(grace, Failure):
        return grace
    names = list(dict.fromkeys(spec.nodes))
    with db.write() as s:
        busy = s.scalar(select(Rollout.id).where(Rollout.state.in_(OPEN)).limit(1))
        if busy is not None:
            return conflict(f"rollout {busy} is still open: wait for it, resume it or abort it")
        known = set(s.scalars(select(NodeRow.name).where(NodeRow.name.in_(names))))
        missing = [n for n in names if n not in known]
        if missing:
            return not_found(f"no such node(s): {', '.join(missing[:10])}")
        ro = Rollout(
            created_at=now,
            created_by=actor.name,
            state="active",
            max_unavailable=spec.max_unavailable,
            grace_s=grace,
            requeue=False,
            reason=spec.reason or f"driver upgrade to {spec.expect_driver} by {actor.name}",
            expect_driver=spec.expect_driver,
            hook=spec.hook,
        )
        s.add(ro)
        s.flush()
        s.add_all(
            RolloutNode(rollout_id=ro.id, node=n, position=i, state="waiting", phase_at=now)
            for i, n in enumerate(names)
        )
        how = f"hook {spec.hook}" if spec.hook else "by hand"
        _event(
            s,
            now=now,
            node="",
            kind="upgrade_started",
            reason=f"upgrade rollout {ro.id}: {len(names)} node(s) to driver {spec.expect_driver} ({how}), "
            f"{spec.max_unavailable} at a time, by {actor.name}",
        )
        s.flush()
        out = rollout_out(s, ro)
        effects.wake_lifecycle(s)  # it drains the first batch
    return out


def show(*, db: Database, actor: Principal, rollout_id: int | None) -> RolloutOut | Failure:
    """``rollout_id`` None: the open upgrade, else the latest."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.read() as s:
        if rollout_id is None:
            ro = s.scalar(
                select(Rollout)
                .where(Rollout.expect_driver.is_not(None))
                .order_by(Rollout.state.in_(OPEN).desc(), Rollout.id.desc())
                .limit(1)
            )
            if ro is None:
                return not_found("no driver upgrade")
        else:
            found = _upgrade(s, rollout_id, None)
            if isinstance(found, Failure):
                return found
            ro = found
        return rollout_out(s, ro)


def pause(*, db: Database, actor: Principal, rollout_id: int, now: float) -> RolloutOut | Failure:
    """No new node is drained; nodes under way finish their step."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.write() as s:
        ro = _upgrade(s, rollout_id, ("active",))
        if isinstance(ro, Failure):
            return ro
        ro.state, ro.pause_reason = "paused", f"paused by {actor.name}"
        _event(
            s, now=now, node="", kind="upgrade_paused", reason=f"upgrade rollout {ro.id}: {ro.pause_reason}"
        )
        s.flush()
        return rollout_out(s, ro)


def resume(
    *, db: Database, actor: Principal, rollout_id: int, spec: ResumeIn, now: float
) -> RolloutOut | Failure:
    """Go on: nodes waiting for a manual upgrade are verified, failed ones tried again
    (their hook run again, or verified again when upgraded by hand); ``skip``: failed or
    waiting nodes left out of the rollout (a failed one stays cordoned)."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.write() as s:
        ro = _upgrade(s, rollout_id)
        if isinstance(ro, Failure):
            return ro
        members = _members(s, ro)
        names = {m.node for m in members}
        unknown = [n for n in spec.skip if n not in names]
        if unknown:
            return invalid(f"not in upgrade {rollout_id}: {', '.join(unknown[:10])}")
        for m in members:
            if m.node in spec.skip and m.state in ("waiting", "failed", "upgrading"):
                m.state, m.phase_at, m.finished_at = "skipped", now, now
                m.reason = f"skipped by {actor.name}"
                _event(
                    s,
                    now=now,
                    node=m.node,
                    kind="upgrade_skipped",
                    reason=f"upgrade rollout {ro.id}: {m.reason}",
                )
            elif m.node in spec.skip:
                return conflict(
                    f"node {m.node} is {m.state}: only waiting, upgrading or failed nodes are skipped"
                )
        for m in members:
            press_on(s, ro, m, now=now, actor=actor.name)
        ro.state, ro.pause_reason = "active", None
        _event(
            s,
            now=now,
            node="",
            kind="upgrade_resumed",
            reason=f"upgrade rollout {ro.id}: resumed by {actor.name}",
        )
        s.flush()
        out = rollout_out(s, ro)
        effects.wake_lifecycle(s)
    return out


def abort(*, db: Database, actor: Principal, rollout_id: int, now: float) -> RolloutOut | Failure:
    """Stop for good. Nodes still draining (not touched yet) go back into service; nodes
    being upgraded or failed stay cordoned for the operator (their driver is in an
    unknown state); a hook already running on a node finishes there (killing a driver
    install half-way would be worse)."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.write() as s:
        ro = _upgrade(s, rollout_id)
        if isinstance(ro, Failure):
            return ro
        for m in _members(s, ro):
            node = s.get(NodeRow, m.node)
            if m.state == "draining" and node is not None:
                node.cordoned, node.cordon_reason = False, None
                node.drain_deadline, node.drain_requeue = None, False
                m.state, m.phase_at, m.reason = "waiting", now, "rollout aborted while draining: uncordoned"
                _event(
                    s,
                    now=now,
                    node=m.node,
                    kind="upgrade_aborted",
                    reason=f"upgrade rollout {ro.id}: {m.reason}",
                )
            elif m.state in ("upgrading", "verifying", "failed"):
                m.reason = f"rollout aborted while {m.state}: check the node, then uncordon it"
                _event(
                    s,
                    now=now,
                    node=m.node,
                    kind="upgrade_aborted",
                    severity="warning",
                    reason=f"upgrade rollout {ro.id}: {m.reason}",
                )
        ro.state, ro.finished_at = "aborted", now
        ro.pause_reason = f"aborted by {actor.name}"
        _event(
            s,
            now=now,
            node="",
            kind="upgrade_aborted",
            reason=f"upgrade rollout {ro.id}: aborted by {actor.name}",
        )
        effects.invalidate_fleets(s)
        effects.wake_scheduler(s)
        s.flush()
        return rollout_out(s, ro)


def press_on(s: Session, ro: Rollout, m: RolloutNode, *, now: float, actor: str) -> bool:
    """One node of an open upgrade goes on (``resume``, or its ``uncordon``): upgraded by
    hand -> verified; failed -> its hook run again (or, by hand, verified again). True
    if it moved."""
    if m.state == "upgrading" and ro.hook is None:
        _order(s, ro, m, "verifying", now=now, why=f"upgraded by hand (said {actor}): verifying")
        return True
    if m.state == "failed":
        again = "upgrading" if ro.hook is not None else "verifying"
        _order(s, ro, m, again, now=now, why=f"tried again by {actor} after: {m.reason}")
        return True
    return False


def member_of_open(s: Session, node: str) -> tuple[Rollout, RolloutNode] | None:
    """The open upgrade that holds ``node`` out of service, with its member row."""
    row = s.execute(
        select(Rollout, RolloutNode)
        .join(RolloutNode, RolloutNode.rollout_id == Rollout.id)
        .where(
            Rollout.state.in_(OPEN),
            Rollout.expect_driver.is_not(None),
            RolloutNode.node == node,
            RolloutNode.state.in_(UNAVAILABLE),
        )
        .limit(1)
    ).first()
    return None if row is None else (row[0], row[1])


# -- the node's sync ------------------------------------------------------------------------------


def order_for(s: Session, node: str) -> UpgradeOrder | None:
    """What the node's agent is to carry out now (a sync reply's ``upgrade``)."""
    found = member_of_open(s, node)
    if found is None:
        return None
    ro, m = found
    if m.attempt <= 0 or ro.expect_driver is None:
        return None
    if m.state == "verifying":
        hook = None
    elif m.state == "upgrading" and ro.hook is not None:
        hook = ro.hook
    else:
        return None
    return UpgradeOrder(rollout=ro.id, attempt=m.attempt, hook=hook, expect_driver=ro.expect_driver)


def record_report(s: Session, node: str, report: UpgradeReport, *, now: float) -> bool:
    """A node's report on its order, in its sync's transaction; True if it changed
    something. A report on another rollout or attempt (an old one, resent) is ignored."""
    found = member_of_open(s, node)
    if found is None:
        return False
    ro, m = found
    if (report.rollout, report.attempt) != (ro.id, m.attempt) or m.state not in ("upgrading", "verifying"):
        return False
    if report.stage == "running_hook":
        return False
    if report.stage == "verifying" and m.state == "verifying":
        return False
    if m.state == "upgrading" and report.hook_error is None:  # the hook is done (the report may say all)
        m.state, m.phase_at, m.reason = "verifying", now, "hook done: verifying"
        _event(
            s,
            now=now,
            node=node,
            kind="upgrade_verifying",
            reason=f"upgrade rollout {ro.id}: hook done, verifying",
        )
    if report.stage == "verifying":
        return True
    gpus = s.scalar(select(func.count()).select_from(GpuRow).where(GpuRow.node == node)) or 0
    why = verdict.failure(report, expect_driver=ro.expect_driver or "", gpus=gpus)
    m.driver = (report.driver_version or "")[:64] or None
    if why is not None:
        _fail(s, ro, m, why, now=now)
        return True
    m.state, m.phase_at, m.finished_at, m.reason = "done", now, now, None
    n = s.get(NodeRow, node)
    back = n is not None and n.cordoned and n.cordon_reason == held_reason(ro)
    if back and n is not None:
        n.cordoned, n.cordon_reason = False, None
        n.drain_deadline, n.drain_requeue = None, False
    else:
        m.reason = "verified, but someone else cordoned it meanwhile: left cordoned"
    checked = len(report.gpus)
    _event(
        s,
        now=now,
        node=node,
        kind="upgrade_verified",
        reason=f"upgrade rollout {ro.id}: driver {report.driver_version}, {checked} GPU(s) healthy and "
        f"passed the smoke check; {'uncordoned' if back else m.reason}",
    )
    effects.invalidate_fleets(s)
    effects.wake_scheduler(s)
    effects.wake_lifecycle(s)  # the next node may drain now
    return True


# -- the lifecycle loop ---------------------------------------------------------------------------


def steps(s: Session) -> list[tuple[int, str]]:
    """(rollout, node) of every member the loop may move now (observe first)."""
    ro = s.scalar(
        select(Rollout)
        .where(Rollout.state.in_(OPEN), Rollout.expect_driver.is_not(None))
        .order_by(Rollout.id)
        .limit(1)
    )
    if ro is None:
        return []
    moving = ("waiting", "draining") if ro.state == "active" else ("draining",)
    return [(ro.id, m.node) for m in _members(s, ro) if m.state in moving]


def advance(s: Session, rollout_id: int, node: str, now: float) -> int:
    """One member, in its own transaction: waiting -> draining once every node of the
    batches before its own (``max_unavailable`` nodes each, in the order given) is done,
    as a rollout "per batch" is read: a bad node stops the rollout at its batch, never
    a window that slid past it while it drained; draining -> upgrading once no job
    holds the node."""
    ro = s.get(Rollout, rollout_id)
    m = s.get(RolloutNode, (rollout_id, node))
    if ro is None or m is None or ro.state not in OPEN:
        return 0
    n = s.get(NodeRow, node)
    if n is None:  # the node was deleted: nothing to upgrade
        m.state, m.phase_at, m.finished_at, m.reason = "skipped", now, now, "node deleted"
        return 1
    if m.state == "waiting" and ro.state == "active":
        first = (m.position // ro.max_unavailable) * ro.max_unavailable  # its batch's first position
        behind = s.scalar(
            select(func.count())
            .select_from(RolloutNode)
            .where(
                RolloutNode.rollout_id == ro.id,
                RolloutNode.position < first,
                RolloutNode.state.not_in(("done", "skipped")),
            )
        )
        out = s.scalar(
            select(func.count())
            .select_from(RolloutNode)
            .where(RolloutNode.rollout_id == ro.id, RolloutNode.state.in_(UNAVAILABLE))
        )
        if behind or (out or 0) >= ro.max_unavailable:
            return 0
        start_drain(s, n, now=now, grace_s=ro.grace_s, requeue=False, reason=held_reason(ro), actor=ACTOR)
        m.state, m.started_at, m.phase_at, m.reason = "draining", now, now, None
        return 1
    if m.state == "draining":
        if s.scalar(select(Allocation.id).where(Allocation.node == node).limit(1)) is not None:
            return 0
        n.cordoned, n.cordon_reason = True, held_reason(ro)
        n.drain_deadline, n.drain_requeue = None, False
        if ro.hook is not None:
            _order(s, ro, m, "upgrading", now=now, why=f"drained: running hook {ro.hook}")
        else:
            m.state, m.phase_at = "upgrading", now
            m.reason = "drained: upgrade the driver by hand, then `gpufleet upgrade resume` (or uncordon it)"
            _event(
                s, now=now, node=node, kind="upgrade_waiting", reason=f"upgrade rollout {ro.id}: {m.reason}"
            )
        return 1
    return 0


def finish(s: Session, now: float) -> int:
    """The open upgrade is done once every node is done (or skipped)."""
    ro = s.scalar(
        select(Rollout).where(Rollout.state == "active", Rollout.expect_driver.is_not(None)).limit(1)
    )
    if ro is None:
        return 0
    members = _members(s, ro)
    if any(m.state not in ("done", "skipped") for m in members):
        return 0
    ro.state, ro.finished_at = "done", now
    done = sum(1 for m in members if m.state == "done")
    _event(
        s,
        now=now,
        node="",
        kind="upgrade_done",
        reason=f"upgrade rollout {ro.id}: {done} of {len(members)} node(s) on driver {ro.expect_driver}",
    )
    return 1


# -- steps of one node ----------------------------------------------------------------------------


def _order(s: Session, ro: Rollout, m: RolloutNode, state: str, *, now: float, why: str) -> None:
    """A new order for the node's agent (upgrading: run the hook, verifying: verify)."""
    m.attempt += 1
    m.state, m.phase_at, m.reason = state, now, why
    node = s.get(NodeRow, m.node)
    if node is not None:
        node.cordoned, node.cordon_reason = True, held_reason(ro)
    _event(s, now=now, node=m.node, kind=f"upgrade_{state}", reason=f"upgrade rollout {ro.id}: {why}")
    dispatch.touch(s, [m.node])  # its agent syncs at once and gets the order


def _fail(s: Session, ro: Rollout, m: RolloutNode, why: str, *, now: float) -> None:
    m.state, m.phase_at, m.reason = "failed", now, why[:512]
    _event(
        s,
        now=now,
        node=m.node,
        kind="upgrade_failed",
        severity="critical",
        reason=f"upgrade rollout {ro.id}: {why}; the node stays cordoned",
    )
    if ro.state == "active":
        ro.state = "paused"
        ro.pause_reason = f"node {m.node} failed verification: {why}"[:512]
        _event(
            s,
            now=now,
            node=m.node,
            kind="upgrade_paused",
            severity="warning",
            reason=f"upgrade rollout {ro.id} paused: {ro.pause_reason}",
        )
