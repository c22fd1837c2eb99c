"""Engines, transactions and schema migrations.

SQLite (the default) runs in WAL mode with ``synchronous=FULL`` (a 201 means the row
is on disk) and a busy timeout. Write transactions on SQLite start with
``BEGIN IMMEDIATE`` so two writers never deadlock on a lock upgrade; reads stay
``BEGIN`` (deferred) and run concurrently with the writer. PostgreSQL needs neither:
concurrent writers are serialised by compare-and-set updates (see ``scheduling.py``).

The Alembic environment ships inside the package (``gpufleet/server/migrations``) and is
configured here in code, so no ``alembic.ini`` is needed at runtime.

Secrets: job ``env`` values and token digests are bound parameters, so every engine is
made with ``hide_parameters=True`` (a failed statement's error, and any log line that
quotes it, shows the SQL without its values). A SQLite database file is created mode
0600 before SQLite opens it (its ``-wal`` and ``-shm`` files take the database file's
mode), and an existing one is tightened to 0600.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs
from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.server.store import effects
from gpufleet.server.store.effects import Effect, Marks

if TYPE_CHECKING:
    from alembic.config import Config

BUSY_TIMEOUT_MS = 10_000
log = logging.getLogger("gpufleet.server")


def default_database_url() -> str:
    """``GPUFLEET_DATABASE_URL`` or a SQLite file in the user's data directory."""
    env = os.environ.get("GPUFLEET_DATABASE_URL")
    if env:
        return env
    path = Path(platformdirs.user_data_dir("gpufleet")) / "gpufleet.db"
    return f"sqlite:///{path}"


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_private(path: Path, text: str | None = None) -> None:
    """Create ``path`` mode 0600 (whatever the umask), with ``text`` when given; an
    existing file is an error (FileExistsError)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(fd, 0o600)
        if text is not None:
            f.write(text)


def private_sqlite_file(path: Path) -> None:
    """The database file (and its -wal/-shm, which SQLite then creates with the same
    mode) exists and is mode 0600. A file someone else owns is left as it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        create_private(path)
    except FileExistsError:
        for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            with contextlib.suppress(FileNotFoundError, PermissionError):
                if f.stat().st_mode & 0o077:
                    f.chmod(0o600)


def make_engine(url: str) -> Engine:
    if not _is_sqlite(url):
        return create_engine(url, pool_size=16, max_overflow=16, pool_pre_ping=True, hide_parameters=True)
    db = make_url(url).database
    if db and db != ":memory:" and not db.startswith("file:"):
        private_sqlite_file(Path(db).expanduser())
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
        pool_size=16,
        max_overflow=16,
        hide_parameters=True,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see "begin" below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


@dataclass(frozen=True, slots=True, kw_only=True)
class Database:
    """The one seam to the SQL store: short transactions as context managers."""

    url: str
    engine: Engine
    _write_engine: Engine
    _read: sessionmaker[Session]
    _write: sessionmaker[Session]
    _bells: list[Callable[[set[str]], None]] = field(default_factory=list)
    _hooks: dict[Effect, list[Callable[[], None]]] = field(default_factory=dict)
    fence: Callable[[Session], None] | None = None
    """Run first in every ``write`` transaction (a leader's loops: ``leader.PgFence``); it
    raises to refuse the transaction before anything is written."""

    @classmethod
    def connect(cls, url: str) -> Database:
        engine = make_engine(url)
        write_engine = engine.execution_options(sqlite_immediate=True)
        return cls(
            url=url,
            engine=engine,
            _write_engine=write_engine,
            _read=sessionmaker(engine, expire_on_commit=False),
            _write=sessionmaker(write_engine, expire_on_commit=False),
        )

    def writer_connection(self) -> Connection:
        """A connection whose transactions are write transactions (``BEGIN IMMEDIATE``
        on SQLite), for a long-lived writer such as the group commit."""
        return self._write_engine.connect()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as s, s.begin():
            yield s

    def fenced(self, fence: Callable[[Session], None]) -> Database:
        """This database (the same engines, bells and hooks) with every write fenced."""
        return dataclasses.replace(self, fence=fence)

    @property
    def is_sqlite(self) -> bool:
        return _is_sqlite(self.url)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed on normal exit, rolled back on any exception.
        What it marked (``effects.py``: the nodes it touched, the loops to wake, the
        caches to drop) follows the commit, and only a commit."""
        with self._write() as s:
            try:
                with s.begin():
                    if self.fence is not None:
                        self.fence(s)
                    yield s
            except BaseException:
                effects.take(s)
                raise
            marked = effects.take(s)
        if marked:
            self.committed(marked)

    def on_ring(self, bell: Callable[[set[str]], None]) -> None:
        """Call ``bell`` with the nodes of every committed write that touched some
        (``dispatch.py``)."""
        self._bells.append(bell)

    def after_commit(self, effect: Effect, hook: Callable[[], None]) -> None:
        """Call ``hook`` after every committed write that marked ``effect`` (the app
        registers them at assembly; ``effects.py``)."""
        self._hooks.setdefault(effect, []).append(hook)

    def ring(self, nodes: set[str]) -> None:
        for bell in self._bells:
            bell(nodes)

    def committed(self, marked: Marks) -> None:
        """Set off what a committed transaction marked: ring its nodes, then each hook of
        each effect (in ``Effect`` order). A hook that raises is logged and the rest
        still run: the write has committed either way."""
        if marked.nodes:
            self.ring(marked.nodes)
        for effect in Effect:
            if effect not in marked.effects:
                continue
            for hook in self._hooks.get(effect, ()):
                try:
                    hook()
                except Exception:
                    log.exception("after-commit hook %s failed", effect.value)

    def dispose(self) -> None:
        self.engine.dispose()


# -- migrations -----------------------------------------------------------------------------


def alembic_config(url: str) -> Config:
    """Alembic is imported by the functions of this part only: the scheduling child never
    migrates, and Alembic costs a process some 5 MB (issue 35)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "gpufleet.server:migrations")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    return heads[0]


def upgrade(url: str, revision: str = "head") -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            from alembic import command

            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def create_if_empty(engine: Engine, url: str) -> bool:
    """Create the schema (``upgrade`` to head) when the database holds no table at all,
    so that the first ``gpufleet server`` on a new database just starts; True if it did.
    A database with tables but no revision, or at an older revision, is left alone:
    ``schema_problem`` refuses it, and migrating data stays an explicit
    ``gpufleet db upgrade`` (after a backup)."""
    if current_revision(engine) is not None or inspect(engine).get_table_names():
        return False
    upgrade(url)
    return True


def schema_problem(engine: Engine, url: str) -> str | None:
    """None when the database is at the package's head revision, else why not."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return None
    where = make_url(url).render_as_string(hide_password=True)
    if current is None:
        return (
            f"database {where} is not initialised (no schema revision, and not empty, so the "
            f"server does not create one): run `gpufleet db upgrade --database-url {where}` "
            "if it is gpufleet's"
        )
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(url))
    known = {rev.revision for rev in script.walk_revisions()}
    if current not in known:
        return (
            f"database {where} has schema revision {current}, newer than this gpufleet "
            f"(head {head}): upgrade gpufleet"
        )
    return f"database {where} is at revision {current}, not {head}: run `gpufleet db upgrade`"
