"""Backups of the server's database, and restores into an empty one.

``backup(url, dest)`` writes a consistent copy while the server runs and writes:

- **SQLite**: SQLite's online backup API (``sqlite3.Connection.backup``, all pages in
  one step, so one read transaction: the copy is the database as of one commit, the
  WAL's committed pages included; WAL readers never block the writer). The copy is
  switched to ``journal_mode=DELETE`` (one self-contained file) and passes
  ``PRAGMA quick_check`` before it gets its name.
- **PostgreSQL**: ``pg_dump --format=custom`` (one repeatable-read snapshot; restored by
  ``pg_restore``), as PostgreSQL's documentation advises for a logical backup. The URL's
  password never goes on a command line (``/proc/PID/cmdline`` is world-readable): it is
  written to a private ``PGPASSFILE`` (0600, in a 0700 directory, deleted afterwards)
  named in the child's environment only, the form libpq's documentation recommends over
  ``PGPASSWORD``. A URL without a password leaves libpq its own ``PGPASSWORD`` and
  ``~/.pgpass``. ``--no-password``: a tool never waits on a prompt.

Either way the copy is written to a temporary file (0600, from ``mkstemp``) in the
target's directory, flushed to disk, then linked to its name (never over an existing
file) and the directory flushed: no half-written backup ever carries the final name.

``restore(file, url)`` fills an **empty** database only: ``restore_problem`` refuses a
database with tables, a file that is no gpufleet backup, or one whose schema revision
this gpufleet does not know (newer). A backup at an older revision is migrated forward
(Alembic, ``db.upgrade``): on SQLite before it lands in the target (the target receives
the migrated copy in one backup-API step, all or nothing), on PostgreSQL right after
``pg_restore --single-transaction``. While it restores a SQLite file it holds the file's
server lock, so no server starts on it half-way.

Not in a backup: the token secret (``tokenkey.py``): a server on a restored database
needs the secret the old one used (``--token-secret-file``), else it refuses to start.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from gpufleet.server.errors import BackupError
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.leader import SqliteLock

Kind = Literal["sqlite", "pg_dump"]
SQLITE_MAGIC = b"SQLite format 3\x00"
PGDUMP_MAGIC = b"PGDMP"
BUSY_S = dbmod.BUSY_TIMEOUT_MS / 1000
_STDERR_CHARS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class Backup:
    """A backup written: where, how big, of which schema revision, by which means."""

    path: Path
    size: int
    revision: str | None
    kind: Kind


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    """A restore done: the backup's revision, and the one the database is at now."""

    revision: str
    now_at: str

    @property
    def migrated(self) -> bool:
        return self.revision != self.now_at


def kind_of(url: str) -> Kind:
    return "sqlite" if make_url(url).get_backend_name() == "sqlite" else "pg_dump"


def shown(url: str) -> str:
    """The URL as messages show it: the password masked."""
    return make_url(url).render_as_string(hide_password=True)


# -- backup -----------------------------------------------------------------------------------


def backup(url: str, dest: Path, *, timeout_s: float | None = None) -> Backup:
    """Write a backup of ``url``'s database to ``dest`` (which must not exist); a
    ``BackupError`` says why not, and leaves nothing at ``dest``. ``timeout_s`` bounds
    ``pg_dump`` (the backup loop's; the CLI waits as long as it takes)."""
    kind = kind_of(url)
    if dest.exists() or dest.is_symlink():
        raise BackupError(f"{dest} exists; choose a new file")
    src = _sqlite_path(url) if kind == "sqlite" else None
    if kind == "sqlite" and (src is None or not src.is_file()):
        raise BackupError(f"no SQLite database at {make_url(url).database!r}")
    try:
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".gpufleet-backup-", suffix=".tmp")
    except OSError as exc:
        raise BackupError(f"cannot write in {dest.parent}: {exc.strerror}") from exc
    os.close(fd)
    tmp = Path(name)
    try:
        if src is not None:
            _sqlite_copy(src, tmp)
        else:
            _pg_dump(url, tmp, timeout_s=timeout_s)
        revision = revision_of(tmp)
        _publish(tmp, dest)
    except OSError as exc:
        raise BackupError(f"cannot write {dest}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return Backup(path=dest, size=dest.stat().st_size, revision=revision, kind=kind)


def _sqlite_path(url: str) -> Path | None:
    db = make_url(url).database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db).expanduser()


def _readonly(path: Path) -> str:
    return f"{path.resolve().as_uri()}?mode=ro"


def _sqlite_copy(src: Path, dst: Path, *, readonly: bool = False) -> None:
    """Every page of ``src`` into ``dst`` in one backup step (one snapshot), made one
    self-contained file (no WAL) that passes ``quick_check``."""
    source = _readonly(src) if readonly else str(src)
    try:
        with (
            closing(sqlite3.connect(source, timeout=BUSY_S, uri=readonly)) as a,
            closing(sqlite3.connect(dst)) as b,
        ):
            a.backup(b)
            b.execute("PRAGMA journal_mode=DELETE")
            check = b.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as exc:
        raise BackupError(f"SQLite backup of {src} failed: {exc}") from exc
    if check != "ok":
        raise BackupError(f"the copy of {src} fails SQLite's quick_check: {check}")
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())


def _publish(tmp: Path, dest: Path) -> None:
    """Give the finished ``tmp`` the name ``dest``, never replacing a file there; then
    flush the directory so the name survives a crash."""
    try:
        os.link(tmp, dest)
    except FileExistsError:
        raise BackupError(f"{dest} exists; choose a new file") from None
    except OSError as exc:  # a file system without hard links
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        if dest.exists():
            raise BackupError(f"{dest} exists; choose a new file") from None
        os.replace(tmp, dest)
    dirfd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


# -- PostgreSQL's tools ----------------------------------------------------------------------


def conninfo(url: str) -> str:
    """The URL as libpq's tools take it: no ``+driver``, no password."""
    u = make_url(url)
    bare = URL.create(
        "postgresql", username=u.username, host=u.host, port=u.port, database=u.database, query=u.query
    )  # URL.set(password=None) would keep the password
    return bare.render_as_string(hide_password=False)


@contextlib.contextmanager
def _pg_env(url: str) -> Iterator[dict[str, str]]:
    """The tools' environment: with the URL's password in a private PGPASSFILE."""
    env = dict(os.environ)
    password = make_url(url).password
    if password is None:
        yield env
        return
    home = tempfile.mkdtemp(prefix="gpufleet-pgpass-")  # 0700
    try:
        path = Path(home) / "pgpass"
        dbmod.create_private(path, "*:*:*:*:" + _pgpass_escape(str(password)) + "\n")
        env["PGPASSFILE"] = str(path)
        env.pop("PGPASSWORD", None)  # it would win over the file
        yield env
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _pgpass_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def _run(argv: list[str], *, url: str, what: str, timeout_s: float | None = None) -> str:
    """Run a PostgreSQL tool; its stdout, or a ``BackupError`` with its stderr."""
    if shutil.which(argv[0]) is None:
        hint = " ".join(argv).replace(conninfo(url), shown(libpq(url)))
        raise BackupError(
            f"{argv[0]} is not installed here (PostgreSQL's client tools, of the server's major "
            f"version or newer); {what} with:\n  {hint}"
        )
    with _pg_env(url) as env:
        try:
            res = subprocess.run(
                argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise BackupError(f"{argv[0]} took longer than {timeout_s:g} s; stopped") from None
    if res.returncode != 0:
        raise BackupError(f"{argv[0]} failed: {res.stderr.strip()[:_STDERR_CHARS]}")
    return res.stdout


def libpq(url: str) -> str:
    """The URL with libpq's scheme (and its password, for display through ``shown``)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _pg_dump(url: str, dest: Path, *, timeout_s: float | None) -> None:
    argv = ["pg_dump", "--format=custom", "--no-password", "--file", str(dest), "--dbname", conninfo(url)]
    _run(argv, url=url, what="back up", timeout_s=timeout_s)
    with open(dest, "rb+") as f:
        os.fsync(f.fileno())


def _pg_revision(path: Path) -> str | None:
    """The ``alembic_version`` row of a custom-format dump, read by ``pg_restore`` (no
    database needed)."""
    argv = ["pg_restore", "--data-only", "--table=alembic_version", "--file=-", str(path)]
    out = _run(argv, url="postgresql://", what="read it")
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("COPY ") and "alembic_version" in line and i + 1 < len(lines):
            value = lines[i + 1].strip()
            return None if value in ("", "\\.") else value
    return None


# -- restore -------------------------------------------------------------------------------


def format_of(path: Path) -> Kind | None:
    """What made the file, by its first bytes: SQLite, pg_dump's custom format, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc.strerror}") from exc
    if head.startswith(PGDUMP_MAGIC):
        return "pg_dump"
    return "sqlite" if head == SQLITE_MAGIC else None


def revision_of(path: Path) -> str | None:
    """The schema revision a backup file holds; None when it is no gpufleet backup."""
    fmt = format_of(path)
    if fmt == "pg_dump":
        return _pg_revision(path)
    if fmt is None:
        return None
    try:
        with closing(sqlite3.connect(_readonly(path), uri=True)) as c:
            row = c.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def _known_revisions() -> set[str]:
    script = ScriptDirectory.from_config(dbmod.alembic_config("sqlite://"))
    return {rev.revision for rev in script.walk_revisions()}


def _tables(url: str) -> list[str]:
    path = _sqlite_path(url) if kind_of(url) == "sqlite" else None
    if path is not None and not path.exists():
        return []
    engine = create_engine(url)
    try:
        return inspect(engine).get_table_names()
    finally:
        engine.dispose()


def restore_problem(file: Path, url: str) -> str | None:
    """None when ``file`` can be restored into ``url``'s database, else why not."""
    if not file.is_file():
        return f"no backup file {file}"
    kind = kind_of(url)
    if kind == "sqlite" and _sqlite_path(url) is None:
        return "restore needs a SQLite file URL (sqlite:///PATH)"
    revision = revision_of(file)
    if revision is None:
        return f"{file} is not a gpufleet backup (no schema revision in it)"
    if revision not in _known_revisions():
        return (
            f"{file} holds schema revision {revision}, newer than this gpufleet "
            f"(head {dbmod.head_revision()}): restore it with the gpufleet that made it"
        )
    fmt = format_of(file)
    if fmt != kind:
        made = "a SQLite database" if fmt == "sqlite" else "pg_dump (PostgreSQL)"
        return f"{file} is a backup of {made}; {shown(url)} is not one"
    try:
        tables = _tables(url)
    except SQLAlchemyError as exc:
        return f"cannot reach {shown(url)}: {str(exc).splitlines()[0]}"
    if tables:
        return (
            f"{shown(url)} is not empty ({len(tables)} tables): restore only into an empty "
            "database (a new SQLite file, or a PostgreSQL database just created)"
        )
    return None


def restore(file: Path, url: str) -> Restored:
    """Restore ``file`` into ``url``'s empty database and migrate it to this gpufleet's
    head; ``BackupError`` when it cannot (call ``restore_problem`` first: it says why
    most restores would be refused, before anything is written)."""
    problem = restore_problem(file, url)
    if problem is not None:
        raise BackupError(problem)
    revision = revision_of(file)
    assert revision is not None  # restore_problem checked it
    head = dbmod.head_revision()
    path = _sqlite_path(url)
    if kind_of(url) == "sqlite" and path is not None:
        _restore_sqlite(file, path, url, migrate=revision != head)
    else:
        argv = ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction"]
        _run([*argv, "--no-password", "--dbname", conninfo(url), str(file)], url=url, what="restore")
        if revision != head:
            _upgrade(url)
    return Restored(revision=revision, now_at=head)


def _upgrade(url: str) -> None:
    try:
        dbmod.upgrade(url)
    except SQLAlchemyError as exc:
        raise BackupError(
            f"restored, but migrating {shown(url)} failed: {str(exc).splitlines()[0]}; "
            "run `gpufleet db upgrade` once the cause is fixed"
        ) from exc


def _restore_sqlite(file: Path, target: Path, url: str, *, migrate: bool) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = SqliteLock(target)
        why = lock.acquire()
    except OSError as exc:
        raise BackupError(f"cannot restore into {target}: {exc.strerror or exc}") from exc
    if why is not None:
        raise BackupError(why)
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=".gpufleet-restore-", suffix=".tmp")
    except OSError as exc:
        lock.release()
        raise BackupError(f"cannot write in {target.parent}: {exc.strerror or exc}") from exc
    os.close(fd)
    tmp = Path(name)
    try:
        _sqlite_copy(file, tmp, readonly=True)
        if migrate:
            _upgrade(f"sqlite:///{tmp}")
        dbmod.private_sqlite_file(target)  # made 0600 if new
        with (
            closing(sqlite3.connect(tmp, timeout=BUSY_S)) as a,
            closing(sqlite3.connect(target, timeout=BUSY_S)) as b,
        ):
            if b.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]:
                raise BackupError(f"{shown(url)} got tables while restoring; nothing was restored")
            a.backup(b)  # one step: all or nothing
    except (sqlite3.Error, OSError) as exc:
        raise BackupError(f"restoring into {target} failed: {exc}") from exc
    finally:
        for f in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        lock.release()


__all__ = [
    "Backup",
    "Kind",
    "Restored",
    "backup",
    "conninfo",
    "format_of",
    "kind_of",
    "restore",
    "restore_problem",
    "revision_of",
    "shown",
]
