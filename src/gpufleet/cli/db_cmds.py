"""``gpufleet db upgrade``, ``gpufleet db backup FILE`` and ``gpufleet db restore FILE``.

Backup and restore on SQLite: online, through SQLite's backup API (a consistent copy while the server runs
and writes; WAL mode). Restore copies FILE over the database with the same API: stop the
server first, then start it again (it refuses a schema it does not know; run
``gpufleet db upgrade`` after restoring an older backup).

PostgreSQL: ``pg_dump``/``pg_restore`` do it; ``backup`` runs
``pg_dump --format=custom --file FILE URL`` when ``pg_dump`` is on the PATH, else prints
that command; ``restore`` likewise runs or prints
``pg_restore --clean --if-exists --no-owner --dbname URL FILE``.

A backup holds job environments (secrets) and token digests: its file is created mode
0600, as the database itself is (``gpufleet.server.store.db``). The token secret is not in it
(``tokenkey.py``): keep a copy of that file apart from the backups.

These commands import SQLAlchemy and the server's ``db`` module when they run: the rest
of the CLI (``gpufleet queue``...) imports neither.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli._common import fail
from gpufleet.cli.apps import db_app

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

URL_OPT = typer.Option(
    None, "--database-url", help="SQLAlchemy URL (default: GPUFLEET_DATABASE_URL or SQLite)."
)


def make_url(url: str) -> URL:
    """SQLAlchemy's URL parser, imported when a ``db`` command runs: the other commands
    of the CLI (``gpufleet queue``...) import no SQLAlchemy."""
    from sqlalchemy.engine import make_url as parse

    return parse(url)


def create_private(path: Path) -> None:
    from gpufleet.server.store.db import create_private as create

    create(path)


def private_sqlite_file(path: Path) -> None:
    from gpufleet.server.store.db import private_sqlite_file as private

    private(path)


def _url(database_url: str | None) -> str:
    from gpufleet.server.store.db import default_database_url

    return database_url or default_database_url()


def libpq_url(url: str) -> str:
    """The URL as libpq tools take it (no ``+driver``), password included."""
    u = make_url(url).set(drivername="postgresql")
    return u.render_as_string(hide_password=False)


def sqlite_copy(src: str, dst: str) -> int:
    """Copy database ``src`` into ``dst`` with the online backup API; returns pages."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
        pages = int(b.execute("PRAGMA page_count").fetchone()[0])
    a.close()
    b.close()
    return pages


def _is_gpufleet(path: str) -> bool:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
            row = c.execute("SELECT version_num FROM alembic_version").fetchone()
        c.close()
    except sqlite3.Error:
        return False
    return row is not None


def _run_or_print(argv: list[str], shown: list[str], what: str) -> None:
    if shutil.which(argv[0]) is None:
        typer.echo(f"{argv[0]} is not installed here; {what} with:\n  {' '.join(shown)}", err=True)
        raise typer.Exit(1)
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise fail(f"{argv[0]} failed: {res.stderr.strip()[:500]}")


@db_app.command("upgrade")
def db_upgrade(
    database_url: str | None = typer.Option(None, "--database-url", help="SQLAlchemy URL."),
) -> None:
    """Create or migrate the schema to this gpufleet's version."""
    from sqlalchemy.exc import SQLAlchemyError

    from gpufleet.server.store import db

    url = database_url or db.default_database_url()
    try:
        db.upgrade(url)
    except SQLAlchemyError as exc:
        raise fail(f"cannot upgrade {url}: {str(exc).splitlines()[0]}") from None
    typer.echo(f"database at revision {db.head_revision()}")


@db_app.command("backup")
def backup(
    file: Path = typer.Argument(..., help="Backup file to write."), database_url: str | None = URL_OPT
) -> None:
    """Back up the database (online for SQLite; pg_dump for PostgreSQL)."""
    url = _url(database_url)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:" or not Path(u.database).exists():
            raise fail(f"no SQLite database at {u.database!r}")
        if file.exists():
            raise fail(f"{file} exists; choose a new file")
        create_private(file)  # SQLite would make it with the umask's mode
        pages = sqlite_copy(u.database, str(file))
        typer.echo(f"backed up {u.database} to {file} ({pages} pages)")
        return
    shown = ["pg_dump", "--format=custom", "--file", str(file), make_url(libpq_url(url)).render_as_string()]
    argv = ["pg_dump", "--format=custom", "--file", str(file), libpq_url(url)]
    if shutil.which("pg_dump") is None:
        _run_or_print(argv, shown, "back up")  # prints the command
    with contextlib.suppress(FileNotFoundError):
        file.unlink()  # pg_dump overwrites a file; make it anew, 0600 (pg_dump keeps the mode)
    create_private(file)
    try:
        _run_or_print(argv, shown, "back up")
    except typer.Exit:
        file.unlink()
        raise
    typer.echo(f"backed up {u.render_as_string()} to {file} (pg_dump custom format)")


@db_app.command("restore")
def restore(
    file: Path = typer.Argument(..., help="A file written by `gpufleet db backup`."),
    database_url: str | None = URL_OPT,
    yes: bool = typer.Option(False, "--yes", help="Replace the database without asking."),
) -> None:
    """Replace the database with a backup. Stop the server first."""
    url = _url(database_url)
    u = make_url(url)
    if not file.is_file():
        raise fail(f"no backup file {file}")
    if not yes and not typer.confirm(f"replace {u.render_as_string()} with {file}?"):
        raise typer.Exit(1)
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            raise fail("restore needs a SQLite file URL")
        if not _is_gpufleet(str(file)):
            raise fail(f"{file} is not a gpufleet SQLite backup")
        private_sqlite_file(Path(u.database))
        pages = sqlite_copy(str(file), u.database)
        typer.echo(
            f"restored {file} into {u.database} ({pages} pages); run `gpufleet db upgrade` if it is older"
        )
        return
    argv = ["pg_restore", "--clean", "--if-exists", "--no-owner", "--dbname", libpq_url(url), str(file)]
    shown = [*argv[:5], make_url(libpq_url(url)).render_as_string(), str(file)]
    _run_or_print(argv, shown, "restore")
    typer.echo(f"restored {file} into {u.render_as_string()}")


__all__ = ["backup", "db_upgrade", "libpq_url", "restore", "sqlite_copy"]
