"""``gpufleet db backup`` and ``gpufleet db restore`` as commands (``store/backup.py``):
what they refuse, the schema revision they check and migrate, the file they leave (whole,
0600, never over another), and the password they keep off ``pg_dump``'s command line
(fake PostgreSQL tools on the PATH record what they were given). A running server backed
up and restored: ``tests/server/test_backup_restore.py``."""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from gpufleet.server.store import db as dbmod
from server.conftest import gpufleet, scratch_postgres


def _sql(path: Path, query: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as c, c:
        return list(c.execute(query).fetchall())


def _database(tmp_path: Path, name: str = "g.db", revision: str = "head") -> str:
    url = f"sqlite:///{tmp_path / name}"
    dbmod.upgrade(url, revision)
    return url


def _previous(revision: str) -> str:
    down = ScriptDirectory.from_config(dbmod.alembic_config("sqlite://")).get_revision(revision).down_revision
    assert isinstance(down, str)
    return down


def test_backup_is_whole_private_and_never_over_a_file(tmp_path: Path) -> None:
    url = _database(tmp_path)
    _sql(tmp_path / "g.db", "INSERT INTO pools (name, gpu, description) VALUES ('kept', 1, '')")
    out = tmp_path / "b.db"
    res = gpufleet("db", "backup", str(out), "--database-url", url)
    assert res.returncode == 0, res.stderr
    assert f"schema revision {dbmod.head_revision()}" in res.stdout and "token secret" in res.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert ("kept",) in _sql(out, "SELECT name FROM pools")
    assert _sql(out, "PRAGMA journal_mode") == [("delete",)]  # one self-contained file
    before = out.read_bytes()
    again = gpufleet("db", "backup", str(out), "--database-url", url)
    assert again.returncode == 2 and "exists" in again.stderr
    assert out.read_bytes() == before
    missing = gpufleet(
        "db", "backup", str(tmp_path / "c.db"), "--database-url", f"sqlite:///{tmp_path}/none.db"
    )
    assert missing.returncode == 1 and "no SQLite database" in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.db", "g.db"]  # no temporary file left


def test_restore_fills_an_empty_database_only(tmp_path: Path) -> None:
    url = _database(tmp_path)
    _sql(tmp_path / "g.db", "INSERT INTO pools (name, gpu, description) VALUES ('kept', 1, '')")
    assert gpufleet("db", "backup", str(tmp_path / "b.db"), "--database-url", url).returncode == 0
    refused = gpufleet("db", "restore", str(tmp_path / "b.db"), "--database-url", url)
    assert refused.returncode == 2 and "is not empty" in refused.stderr
    target = tmp_path / "new" / "r.db"
    res = gpufleet("db", "restore", str(tmp_path / "b.db"), "--database-url", f"sqlite:///{target}")
    assert res.returncode == 0, res.stderr
    assert ("kept",) in _sql(target, "SELECT name FROM pools")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".gpufleet-restore-")]
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # a file with no table is empty
    res = gpufleet("db", "restore", str(tmp_path / "b.db"), "--database-url", f"sqlite:///{empty}")
    assert res.returncode == 0, res.stderr


def test_restore_refuses_what_is_no_backup_or_a_newer_one(tmp_path: Path) -> None:
    url = _database(tmp_path)
    target = f"sqlite:///{tmp_path / 'r.db'}"
    (tmp_path / "junk.db").write_text("not a database")
    bad = gpufleet("db", "restore", str(tmp_path / "junk.db"), "--database-url", target)
    assert bad.returncode == 2 and "not a gpufleet backup" in bad.stderr
    assert gpufleet("db", "backup", str(tmp_path / "b.db"), "--database-url", url).returncode == 0
    _sql(tmp_path / "b.db", "UPDATE alembic_version SET version_num = '9999_from_the_future'")
    newer = gpufleet("db", "restore", str(tmp_path / "b.db"), "--database-url", target)
    assert newer.returncode == 2 and "newer than this gpufleet" in newer.stderr
    gone = gpufleet("db", "restore", str(tmp_path / "nothing.db"), "--database-url", target)
    assert gone.returncode == 2 and "no backup file" in gone.stderr
    assert not (tmp_path / "r.db").exists() or not _sql(tmp_path / "r.db", "SELECT name FROM sqlite_master")


def test_an_older_backup_is_migrated_forward(tmp_path: Path) -> None:
    older = _previous(dbmod.head_revision())
    url = _database(tmp_path, revision=older)
    _sql(tmp_path / "g.db", "INSERT INTO pools (name, gpu, description) VALUES ('old', 1, '')")
    assert gpufleet("db", "backup", str(tmp_path / "b.db"), "--database-url", url).returncode == 0
    assert _sql(tmp_path / "b.db", "SELECT version_num FROM alembic_version") == [(older,)]
    res = gpufleet("db", "restore", str(tmp_path / "b.db"), "--database-url", f"sqlite:///{tmp_path}/r.db")
    assert res.returncode == 0, res.stderr
    assert f"migrated to {dbmod.head_revision()}" in res.stdout
    assert _sql(tmp_path / "r.db", "SELECT version_num FROM alembic_version") == [(dbmod.head_revision(),)]
    assert ("old",) in _sql(tmp_path / "r.db", "SELECT name FROM pools")
    assert _sql(tmp_path / "b.db", "SELECT version_num FROM alembic_version") == [(older,)]  # file untouched


FAKE_PG_DUMP = """#!/bin/sh
# records what it was given, then writes a custom-format-looking file (or fails)
printf '%s\\n' "$@" > "$RECORD/argv"
cat "$PGPASSFILE" > "$RECORD/passfile" 2>/dev/null
printf '%s' "$PGPASSFILE" > "$RECORD/passfile_path"
printf '%s' "${PGPASSWORD-unset}" > "$RECORD/pgpassword"
[ -n "$FAIL" ] && { echo "pg_dump: error: connection refused" >&2; exit 1; }
while [ $# -gt 0 ]; do [ "$1" = --file ] && printf 'PGDMP fake' > "$2"; shift; done
"""
FAKE_PG_RESTORE = """#!/bin/sh
printf 'COPY public.alembic_version (version_num) FROM stdin;\\n%s\\n\\\\.\\n' "$HEAD"
"""


@pytest.fixture
def fake_pg(tmp_path: Path) -> dict[str, str]:
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name, script in (("pg_dump", FAKE_PG_DUMP), ("pg_restore", FAKE_PG_RESTORE)):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RECORD": str(record),
        "HEAD": dbmod.head_revision(),
        "PGPASSWORD": "inherited",
    }


def test_pg_dump_gets_the_password_in_a_private_file_never_on_its_command_line(
    tmp_path: Path, fake_pg: dict[str, str]
) -> None:
    out = tmp_path / "out" / "b.dump"
    out.parent.mkdir()
    url = "postgresql+psycopg://fleet:s3cr%3At%5Cx@db.invalid:5433/gf?sslmode=require"
    res = gpufleet("db", "backup", str(out), "--database-url", url, env=fake_pg)
    assert res.returncode == 0, res.stderr
    record = Path(fake_pg["RECORD"])
    argv = (record / "argv").read_text()
    assert "s3cr" not in argv and "postgresql://fleet@db.invalid:5433/gf?sslmode=require" in argv
    assert "--format=custom" in argv and "--no-password" in argv
    assert (record / "passfile").read_text() == "*:*:*:*:s3cr\\:t\\\\x\n"  # libpq's escapes
    assert not Path((record / "passfile_path").read_text()).exists()  # deleted afterwards
    assert (record / "pgpassword").read_text() == "unset"  # it would win over the file
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_bytes() == b"PGDMP fake"
    assert "***" in res.stdout and "s3cr" not in res.stdout + res.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.dump"]


def test_a_failed_pg_dump_leaves_nothing(tmp_path: Path, fake_pg: dict[str, str]) -> None:
    out = tmp_path / "out" / "b.dump"
    out.parent.mkdir()
    url = "postgresql+psycopg://fleet:pw@db.invalid/gf"
    res = gpufleet("db", "backup", str(out), "--database-url", url, env={**fake_pg, "FAIL": "1"})
    assert res.returncode == 1 and "connection refused" in res.stderr and "pw@" not in res.stderr
    assert list(out.parent.iterdir()) == []


def test_without_pg_dump_the_command_is_named_without_its_password(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    res = gpufleet(
        "db", "backup", str(tmp_path / "b.dump"), "--database-url", "postgresql+psycopg://u:pw@db/gf",
        env={"PATH": str(bare)},
    )  # fmt: skip
    assert res.returncode == 1 and "pg_dump is not installed" in res.stderr
    assert "pg_dump --format=custom" in res.stderr and "postgresql://u:***@db/gf" in res.stderr
    assert not (tmp_path / "b.dump").exists()


def test_postgresql_restore_migrates_an_older_dump_and_refuses_a_full_database(tmp_path: Path) -> None:
    older = _previous(dbmod.head_revision())
    with scratch_postgres("bk_src") as source, scratch_postgres("bk_dst") as target:
        dbmod.upgrade(source, older)
        engine = create_engine(source)
        with engine.begin() as c:
            c.execute(text("INSERT INTO pools (name, gpu, description) VALUES ('old', true, '')"))
        engine.dispose()
        dump = tmp_path / "b.dump"
        res = gpufleet("db", "backup", str(dump), "--database-url", source, timeout=120)
        assert res.returncode == 0, res.stderr
        assert dump.read_bytes()[:5] == b"PGDMP" and f"schema revision {older}" in res.stdout
        full = gpufleet("db", "restore", str(dump), "--database-url", source, timeout=120)
        assert full.returncode == 2 and "is not empty" in full.stderr
        sqlite_target = f"sqlite:///{tmp_path / 'r.db'}"
        wrong = gpufleet("db", "restore", str(dump), "--database-url", sqlite_target, timeout=120)
        assert wrong.returncode == 2 and "is a backup of pg_dump" in wrong.stderr
        res = gpufleet("db", "restore", str(dump), "--database-url", target, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"migrated to {dbmod.head_revision()}" in res.stdout
        engine = create_engine(target)
        with engine.connect() as c:
            assert (
                c.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
                == dbmod.head_revision()
            )
            assert c.execute(text("SELECT count(*) FROM pools WHERE name = 'old'")).scalar_one() == 1
        engine.dispose()
