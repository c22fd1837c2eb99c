"""``gpufleet db upgrade``, ``gpufleet db backup FILE`` and ``gpufleet db restore FILE``.

``backup`` writes a consistent copy while the server runs (``store/backup.py``): SQLite
through its online backup API, PostgreSQL through ``pg_dump --format=custom`` (the URL's
password in a private ``PGPASSFILE``, never on a command line). The file appears whole
under its name or not at all, mode 0600: it holds job environments (secrets) and token
digests. The token secret is not in it (``tokenkey.py``): keep a copy of that apart.

``restore`` fills an *empty* database only (a new SQLite file, a PostgreSQL database just
created) and migrates an older backup to this gpufleet's schema; it refuses a database
with tables, and a backup of a newer gpufleet. Then start the server on it with the token
secret the backed-up server used (``--token-secret-file``).

These commands import SQLAlchemy and the server's ``store`` modules when they run: the
rest of the CLI (``gpufleet queue``...) imports neither.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.cli.apps import db_app

URL_OPT = typer.Option(
    None, "--database-url", help="SQLAlchemy URL (default: GPUFLEET_DATABASE_URL or SQLite)."
)


def _url(database_url: str | None) -> str:
    from gpufleet.server.store.db import default_database_url

    return database_url or default_database_url()


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
    file: Path = typer.Argument(..., help="Backup file to write (must not exist)."),
    database_url: str | None = URL_OPT,
) -> None:
    """Back up the database while the server runs (SQLite: online backup API;
    PostgreSQL: pg_dump's custom format). The token secret is not in it."""
    from gpufleet.server.errors import BackupError
    from gpufleet.server.store import backup as store

    url = _url(database_url)
    if file.exists() or file.is_symlink():
        raise fail(f"{file} exists; choose a new file", BAD_INPUT)
    try:
        made = store.backup(url, file)
    except BackupError as exc:
        raise fail(str(exc)) from None
    means = "SQLite backup API" if made.kind == "sqlite" else "pg_dump custom format"
    typer.echo(
        f"backed up {store.shown(url)} to {file} ({made.size} bytes, {means}, "
        f"schema revision {made.revision or 'none'}); the token secret is not in it: keep a copy apart"
    )


@db_app.command("restore")
def restore(
    file: Path = typer.Argument(..., help="A file written by `gpufleet db backup` (or the server's loop)."),
    database_url: str | None = URL_OPT,
) -> None:
    """Restore a backup into an empty database (refuses one with tables), migrating an
    older backup to this gpufleet's schema. Then start the server on it with the old
    server's token secret (--token-secret-file)."""
    from gpufleet.server.errors import BackupError
    from gpufleet.server.store import backup as store

    url = _url(database_url)
    problem = store.restore_problem(file, url)
    if problem is not None:
        raise fail(problem, BAD_INPUT)
    try:
        done = store.restore(file, url)
    except BackupError as exc:
        raise fail(str(exc)) from None
    migrated = f", migrated to {done.now_at}" if done.migrated else ""
    typer.echo(
        f"restored {file} (schema revision {done.revision}{migrated}) into {store.shown(url)}; start the "
        "server with the token secret the backed-up server used (--token-secret-file)"
    )


__all__ = ["backup", "db_upgrade", "restore"]
