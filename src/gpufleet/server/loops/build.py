"""Builds the server's loops (``app.py`` is the only caller): a term's (the scheduling
loop in a thread or a child process, and every other control loop) as one ``Loops``,
and the process's own under HA (``process``: NOTIFY, LISTEN, the lease's keeper)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.clock import Clock
from gpufleet.server.config import ServerConfig
from gpufleet.server.loops.accrual import accrual_loop
from gpufleet.server.loops.alerts import AlertRules, WebhookSender, alert_loop
from gpufleet.server.loops.audit import retention_loop
from gpufleet.server.loops.automig import AutoMigConfig, automig_loop
from gpufleet.server.loops.backup import BackupPolicy, BackupStatus, backup_loop
from gpufleet.server.loops.child import ChildLoop, LoopSpec
from gpufleet.server.loops.diagnosis import diagnosis_loop
from gpufleet.server.loops.lifecycle import LifecycleConfig, LifecyclePass, lifecycle_loop
from gpufleet.server.loops.replicas import replica_loop
from gpufleet.server.loops.scheduling import PassObserver
from gpufleet.server.runner import Loops, Runner
from gpufleet.server.services.autoscaling import Autoscaler
from gpufleet.server.services.dashboard import FleetView
from gpufleet.server.store import ledger
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.effects import Effect
from gpufleet.server.store.leader import Leadership, PgFence
from gpufleet.server.store.pgnotify import PgNotify

IDLE_S = 10.0
"""The longest rest of a loop whose last pass found nothing to do (``runner.Idle``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scheduling:
    """The scheduling loop as the rest of the server sees it: a runner to wake and
    count, and the observer its passes report to."""

    runner: Runner
    observer: PassObserver


def scheduling(
    config: ServerConfig, db: Database, clock: Clock, observer: PassObserver | None = None
) -> Scheduling:
    """The scheduling loop: in a child process with ``config.scheduler_process``, else
    in a thread of this process. A leader's term (``db`` fenced) fences the child too."""
    fence = db.fence if isinstance(db.fence, PgFence) else None
    spec = LoopSpec(
        database_url=db.url,
        policy=config.policy,
        node_timeout_s=config.node_timeout_s,
        interval_s=config.schedule_interval_s,
        reservation_idle_release_s=config.reservation_idle_release_s,
        max_preempt_grace_s=config.max_preempt_grace_s,
        fence_holder=None if fence is None else fence.holder,
        fence_epoch=None if fence is None else fence.epoch,
    )
    observer = observer or PassObserver()
    runner: Runner
    if config.scheduler_process:
        runner = ChildLoop(spec=spec, observer=observer, on_ring=db.ring)
    else:
        runner = spec.loop(db, clock, observer)
    return Scheduling(runner=runner, observer=observer)


def replicas(config: ServerConfig, db: Database, clock: Clock, hot: AgentState) -> Runner:
    """The replica controller and autoscaler of inference services (routers wake it)."""
    return replica_loop(
        db=db,
        clock=clock,
        interval_s=config.service_interval_s,
        drain_s=config.service_drain_s,
        autoscaler=Autoscaler(hot=hot),
        idle_s=IDLE_S,
    )


def term(
    config: ServerConfig,
    *,
    db: Database,
    clock: Clock,
    hot: AgentState,
    observer: PassObserver,
    readings: ledger.Readings,
    after_accrual: Callable[[float], None],
    view: Callable[[], FleetView],
    backups: BackupStatus | None = None,
) -> Loops:
    """Every loop of the server on ``db`` (a leader's term: fenced), not started; the
    scheduling loop is ``loops["scheduling"]``, the replica controller ``loops["replicas"]``.
    ``backups``: what the backup loop (``config.backup_dir``) reports to, across terms."""
    sched = scheduling(config, db, clock, observer)
    return build(
        config,
        db=db,
        clock=clock,
        hot=hot,
        sched=sched,
        replica_runner=replicas(config, db, clock, hot),
        readings=readings,
        after_accrual=after_accrual,
        view=view,
        backups=backups,
    )


def build(
    config: ServerConfig,
    *,
    db: Database,
    clock: Clock,
    hot: AgentState,
    sched: Scheduling,
    replica_runner: Runner,
    readings: ledger.Readings,
    after_accrual: Callable[[float], None],
    view: Callable[[], FleetView],
    backups: BackupStatus | None = None,
) -> Loops:
    """Every loop of the server, not started."""
    loops = Loops([sched.runner, replica_runner])
    single = db.fence is None  # not a leader's term (HA): every wake-up is this server's
    lifecycle = LifecyclePass(
        db=db,
        hot=hot,
        clock=clock,
        config=LifecycleConfig(
            node_timeout_s=config.node_timeout_s,
            requeue_after_s=config.requeue_after_s,
            interval_s=config.schedule_interval_s,
            idle_s=IDLE_S if single else config.schedule_interval_s,  # HA: lifecycle.py
        ),
    )
    loops.add(lifecycle_loop(lifecycle))
    loops.add(
        accrual_loop(
            db=db, clock=clock, readings=readings, interval_s=config.accrual_interval_s, after=after_accrual
        )
    )
    loops.add(
        retention_loop(
            db=db, clock=clock, keep_s=config.audit_days * 86400, log_keep_s=config.log_days * 86400
        )
    )
    diagnosis = loops.add(
        diagnosis_loop(db=db, clock=clock, config=config.diagnosis, idle_s=IDLE_S if single else 1.0)
    )
    if single:  # the one term of this database (SQLite): the sync that queues a row wakes it
        db.after_commit(Effect.WAKE_DIAGNOSIS, diagnosis.wake)
    if config.auto_mig:
        planner = AutoMigConfig(
            interval_s=config.auto_mig_interval_s,
            cooldown_s=config.auto_mig_cooldown_s,
            max_changes=config.auto_mig_max_changes,
            node_timeout_s=config.node_timeout_s,
        )
        loops.add(automig_loop(db=db, clock=clock, config=planner))
    if config.alert_webhook:
        sender = WebhookSender(config.alert_webhook)
        loops.add(sender)  # before the rules' loop: it stops after it, delivering the last messages
        loops.add(
            alert_loop(
                view=view,
                hot=hot,
                sender=sender,
                rules=AlertRules(queue_wait_s=config.queue_wait_alert_s),
                interval_s=config.alert_interval_s,
            )
        )
    if config.backup_dir is not None:
        policy = BackupPolicy(
            directory=config.backup_dir, every_s=config.backup_every_s, keep=config.backup_keep
        )
        status = backups if backups is not None else BackupStatus()
        loops.add(backup_loop(url=db.url, clock=clock, policy=policy, status=status))
    return loops


def process(notify: PgNotify, leadership: Leadership) -> Loops:
    """The loops of the process, not of a term (several servers on one PostgreSQL):
    NOTIFY's sender, LISTEN, then the lease's keeper, which starts and stops the terms.
    Stopped in reverse: the keeper ends the term and gives the lease up while the
    wake-ups of its last steps can still go out."""
    return Loops([*notify.runners, leadership])
