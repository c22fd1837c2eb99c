"""The FastAPI application and how it starts.

``create_app`` wires the parts (database, clock, scheduling loop, caches) and mounts the
routers under ``/v1``; ``prepare`` refuses a database whose schema is not this package's
head revision and creates the first admin on an empty one.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from gpufleet import __version__
from gpufleet.api.users import Health
from gpufleet.clock import Clock, SystemClock
from gpufleet.server import wiring as observability
from gpufleet.server.config import ServerConfig
from gpufleet.server.decide.health import HealthMonitor
from gpufleet.server.errors import ProblemError, StartupError, TokenKeyError
from gpufleet.server.http import audit
from gpufleet.server.http.deps import Parts, PartsDep
from gpufleet.server.http.lanes import Admission
from gpufleet.server.loops import build as loops
from gpufleet.server.loops.backup import BackupStatus
from gpufleet.server.loops.scheduling import PassObserver
from gpufleet.server.metrics.backup import BackupCollector
from gpufleet.server.metrics.leadership import LeaderCollector
from gpufleet.server.problems import BodyLimitMiddleware, UrlGuardMiddleware, install_handlers
from gpufleet.server.routers import agents, jobs, logs, maintenance, nodes, security, services, users
from gpufleet.server.routers import chargeback as chargeback_router
from gpufleet.server.routers import licenses as licenses_router
from gpufleet.server.routers import qos as qos_router
from gpufleet.server.routers import racks as racks_router
from gpufleet.server.routers import reservations as reservations_router
from gpufleet.server.routers import servers as servers_router
from gpufleet.server.routers import steps as steps_router
from gpufleet.server.runner import Loops, Relay
from gpufleet.server.services import chargeback
from gpufleet.server.services.auth import TokenCache
from gpufleet.server.services.caps import PendingCounts
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.services.tokens import bound_lifetimes
from gpufleet.server.services.users import bootstrap_admin
from gpufleet.server.store import db as dbmod
from gpufleet.server.store import ledger
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.dispatch import NodeBell
from gpufleet.server.store.effects import Effect
from gpufleet.server.store.leader import Leadership, Lease, PgFence, SqliteLock, server_id
from gpufleet.server.store.pgnotify import PgNotify
from gpufleet.server.store.telemetry import RecordingTelemetryStore
from gpufleet.server.store.tokenkey import TokenHasher, check_key, load_hasher
from gpufleet.server.store.writer import GroupCommitWriter

if TYPE_CHECKING:
    from gpufleet.pki import CertificateAuthority


def token_hasher(config: ServerConfig) -> TokenHasher:
    """The server's token key (``tokenkey.py``), or a StartupError saying why not."""
    try:
        return load_hasher(database_url=config.database_url, secret_file=config.token_secret_file)
    except TokenKeyError as exc:
        raise StartupError(str(exc)) from None


def prepare(config: ServerConfig, *, clock: Clock, hasher: TokenHasher | None = None) -> dbmod.Database:
    """Connect, create the schema in an empty database (else check its revision), check
    the token key, create the first admin if there is none, and give pre-0008 tokens an
    expiry."""
    hasher = hasher or token_hasher(config)
    db = dbmod.Database.connect(config.database_url)
    try:
        if dbmod.create_if_empty(db.engine, config.database_url):
            print(
                f"gpufleet: created the schema (revision {dbmod.head_revision()}) in the empty database",
                file=sys.stderr,
                flush=True,
            )
        problem = dbmod.schema_problem(db.engine, config.database_url)
    except SQLAlchemyError as exc:
        db.dispose()
        first = str(exc).splitlines()[0]
        raise StartupError(f"cannot reach database: {first}") from exc
    problem = problem or check_key(db, hasher)
    if problem is not None:
        db.dispose()
        raise StartupError(problem)
    token = bootstrap_admin(db=db, now=clock.now(), token=config.admin_token, hasher=hasher)
    bound_lifetimes(db=db, now=clock.now(), ttl_s=config.token_ttl_s)
    if token is not None:
        print(
            "gpufleet: created user 'admin' with token (shown only once):\n"
            f"  {token}\n"
            "  (set GPUFLEET_ADMIN_TOKEN before the first start to choose it)",
            file=sys.stderr,
            flush=True,
        )
    return db


def _health_router() -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return Health(status="ok")

    @router.get("/readyz", response_model=Health, responses={503: {"description": "not ready"}})
    def readyz(parts: PartsDep) -> Health:
        try:
            problem = dbmod.schema_problem(parts.db.engine, parts.db.url)
        except SQLAlchemyError as exc:
            raise ProblemError(503, f"database unreachable: {exc.__class__.__name__}") from exc
        if problem is not None:
            raise ProblemError(503, problem)
        return Health(status="ready")

    return router


class _Term:
    """One leader's term (or a single server's life): its loops, followed by the relays."""

    def __init__(self, everything: Relays, term_loops: Loops, leading: list[bool] | None = None) -> None:
        self.everything = everything
        self.loops = term_loops
        self.leading = leading
        everything.sched.follow(term_loops["scheduling"])
        everything.replicas.follow(term_loops["replicas"])
        if leading is not None:
            leading[0] = True
        term_loops.start()

    def stop(self) -> None:
        if self.leading is not None:
            self.leading[0] = False
        self.everything.sched.follow(None)
        self.everything.replicas.follow(None)
        self.loops.stop()


class Relays:
    """What routers and ``/metrics`` hold of the loops, whichever term runs them."""

    def __init__(self, notify: PgNotify | None) -> None:
        self.sched = Relay("scheduling", None if notify is None else lambda: notify.wake("scheduling"))
        self.replicas = Relay("replicas", None if notify is None else lambda: notify.wake("replicas"))
        self.current: _Term | None = None

    def wake_here(self, loop: str) -> None:
        (self.replicas if loop == "replicas" else self.sched).wake_here()


def _load_ca(directory: Path) -> CertificateAuthority:
    """The cluster CA of ``--ca-dir``. ``gpufleet.pki`` (and with it ``cryptography``, some
    7 MB) is imported only by a server that has one (issue 35)."""
    from gpufleet.pki import CertificateAuthority, PkiError

    try:
        return CertificateAuthority.load_or_create(directory)
    except (PkiError, OSError) as exc:
        raise StartupError(f"--ca-dir {directory}: {exc}") from None


def _sqlite_lock(url: str) -> SqliteLock | None:
    """SQLite is single-server: the lock, or a StartupError naming the server that holds it
    (before this server touches the database)."""
    name = make_url(url).database
    if (
        make_url(url).get_backend_name() != "sqlite"
        or not name
        or name == ":memory:"
        or name.startswith("file:")
    ):
        return None
    lock = SqliteLock(Path(name).expanduser())
    why = lock.acquire()
    if why is not None:
        raise StartupError(why)
    return lock


def create_app(
    config: ServerConfig, *, clock: Clock | None = None, db: dbmod.Database | None = None
) -> FastAPI:
    clock = clock or SystemClock()
    lock = _sqlite_lock(db.url if db is not None else config.database_url)
    try:
        hasher = token_hasher(config)
        database = db if db is not None else prepare(config, clock=clock, hasher=hasher)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    me = server_id()
    observer = PassObserver()
    writer = GroupCommitWriter(database)
    bell = NodeBell()  # agents' long-polls (``dispatch.py``): rung after commits that touch nodes
    database.on_ring(bell.ring)
    hot = AgentState(health=HealthMonitor(config.health), telemetry=RecordingTelemetryStore())  # with history
    # idle means idle (issue 35): sightings and power readings reach the database in bulk, a
    # sixth of the node timeout apart (every reader of last_seen sees a live node in time)
    hot.heartbeats.flush_s = hot.power.flush_s = config.node_timeout_s / 6
    hot.leases.silence_s = config.node_timeout_s
    notify: PgNotify | None = None
    relays = Relays(None)
    leading = [False]  # set by the terms (PostgreSQL): only a leader takes relayed readings
    if not database.is_sqlite:  # several servers may share it: wake-ups, rings and readings cross
        notify = PgNotify(
            database.engine,
            database.url,
            me=me,
            on_wake=lambda loop: relays.wake_here(loop),
            on_touch=bell.ring,
            on_telemetry=hot.relayed_telemetry,
            on_traffic=hot.relayed_traffic,
            wants_observations=lambda: leading[0],
        )
        relays = Relays(notify)
        database.on_ring(notify.touch)
        hot.relay = notify
    readings = ledger.telemetry_readings(
        hot, clock, max_age_s=max(config.node_timeout_s, 2 * config.accrual_interval_s)
    )
    parts = Parts(
        config=config,
        db=database,
        clock=clock,
        scheduler=relays.sched,
        replicas=relays.replicas,
        fleets=FleetCache(),
        tokens=TokenCache(hasher=hasher, clock=clock.now),
        writer=writer,
        readings=readings,
        pending=PendingCounts(cap=config.caps.pending_jobs),
    )
    # What a committed write sets off (``effects.py``): services mark it in their
    # transaction, the database runs these after the commit (never after a rollback).
    database.after_commit(Effect.INVALIDATE_FLEETS, parts.fleets.invalidate)
    database.after_commit(Effect.INVALIDATE_FLEETS, hot.leases.clear)  # a node deleted: no renewal stands
    database.after_commit(
        Effect.REFRESH_BUDGETS, lambda: parts.budget_warnings.refresh(database, clock.now())
    )
    database.after_commit(Effect.WAKE_SCHEDULER, parts.scheduler.wake)
    database.after_commit(Effect.WAKE_REPLICAS, parts.replicas.wake)
    database.after_commit(Effect.WAKE_LIFECYCLE, hot.health.poke)
    if config.prices is not None:
        chargeback.ensure_prices(
            db=database, schedule=config.prices, actor="server --prices", now=clock.now()
        )
    parts.budget_warnings.refresh(database, clock.now())
    audit_log = audit.AuditLog(writer)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        single: _Term | None = None
        own = Loops()  # the process's loops (HA: NOTIFY, LISTEN, the lease's keeper)
        if leadership is None:
            single = _Term(relays, make_loops(database))  # every control loop, as one
        else:
            assert notify is not None
            own = loops.process(notify, leadership)
            own.start()  # the term's loops run while this server leads
        # What start-up built (routes, schemas, SQLAlchemy metadata) lives as long as the
        # process: keep it out of every garbage collection (p99 under load: 165 -> 45 ms).
        gc.freeze()
        try:
            yield
        finally:
            bell.close()  # answer every long-poll: the agents re-sync elsewhere or later
            if single is not None:
                single.stop()
            own.stop()  # the keeper first: it ends the term and gives the lease up
            audit_log.flush()  # the gathered rows, before the writer's last batch
            writer.close()
            database.dispose()
            if lock is not None:
                lock.release()

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        description="One control plane for a shared GPU cluster. Errors are RFC 9457 problem+json.",
        lifespan=lifespan,
        # FastAPI's native OpenTelemetry hooks: off. gpufleet exports Prometheus metrics
        # (``/metrics``) and never sets an OTel provider; left on, every request asks the
        # OTel API (environment look-ups) whether one was set.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.parts = parts
    app.state.hot = hot
    app.state.bell = bell
    app.state.ca = None if config.ca_dir is None else _load_ca(config.ca_dir)
    install_handlers(app)
    app.add_middleware(agents.AgentShortcut)  # innermost: an idle node's renewal and long-poll
    app.add_middleware(jobs.SubmitShortcut)  # innermost: POST /v1/jobs to its route, unrouted
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(audit.AuditMiddleware, audit=audit_log, now=clock.now)  # inside admission
    app.add_middleware(UrlGuardMiddleware)
    app.add_middleware(  # lanes and rate limits: before the body is read or a route is found
        Admission,
        db=database,
        tokens=parts.tokens,
        creds=hot.creds,
        rates=config.rates,
        sizes=config.lanes,
        max_body_bytes=config.max_body_bytes,
    )
    v1 = APIRouter(prefix="/v1")
    v1.include_router(_health_router())
    # routes are matched in order, one by one (~1 ms a request through every router at
    # rest): the agents' syncs, renewals and long-polls, most of an idle fleet's requests,
    # come first (no path of the routers after it matches one of theirs)
    v1.include_router(agents.router)
    v1.include_router(jobs.router)
    v1.include_router(steps_router.router)
    v1.include_router(steps_router.bulk)
    v1.include_router(nodes.router)
    v1.include_router(users.router)
    v1.include_router(logs.router)
    v1.include_router(maintenance.router)
    v1.include_router(reservations_router.router)
    v1.include_router(qos_router.router)
    v1.include_router(licenses_router.router)
    v1.include_router(racks_router.router)
    v1.include_router(racks_router.figures)
    v1.include_router(chargeback_router.router)
    v1.include_router(security.router)
    v1.include_router(services.router)
    v1.include_router(services.gateway_router)
    v1.include_router(servers_router.router)
    app.include_router(v1)
    view = observability.install(app, parts, observer)  # /metrics, the fleet page
    backups = BackupStatus()  # the backup loop's, across terms (``--backup-dir``)
    if config.backup_dir is not None:
        app.state.metrics.registry.register(BackupCollector(backups))

    def make_loops(term_db: dbmod.Database) -> Loops:
        return loops.term(
            config,
            db=term_db,
            clock=clock,
            hot=hot,
            observer=observer,
            readings=readings,
            after_accrual=lambda now: parts.budget_warnings.refresh(database, now),
            view=view,
            backups=backups,
        )

    leadership: Leadership | None = None
    if not database.is_sqlite:
        lease = Lease(database.engine, holder=me, ttl_s=config.leader_ttl_s, version=__version__)
        leadership = Leadership(
            lease,
            start_term=lambda epoch: _Term(relays, make_loops(database.fenced(PgFence(me, epoch))), leading),
        )
    app.state.metrics.registry.register(
        LeaderCollector(
            server=me, leadership=leadership, engine=None if leadership is None else database.engine
        )
    )
    app.state.relays = relays
    app.state.leadership = leadership
    app.state.server_id = me
    app.state.started_at = clock.now()
    return app
