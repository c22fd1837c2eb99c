"""``gpufleet db backup/restore`` on SQLite (online backup API) and the PostgreSQL path
when pg_dump is missing (it prints the command)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from server.conftest import gpufleet


def _pools(path: Path) -> int:
    with sqlite3.connect(path) as c:
        n = int(c.execute("SELECT count(*) FROM pools").fetchone()[0])
    c.close()
    return n


def test_sqlite_backup_and_restore(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    url = f"sqlite:///{db}"
    assert gpufleet("db", "upgrade", "--database-url", url).returncode == 0
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO pools (name, gpu, description) VALUES ('before', 1, '')")
    c.close()
    out = gpufleet("db", "backup", str(tmp_path / "b.db"), "--database-url", url)
    assert out.returncode == 0, out.stderr
    assert gpufleet("db", "backup", str(tmp_path / "b.db"), "--database-url", url).returncode == 1
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO pools (name, gpu, description) VALUES ('after', 1, '')")
    c.close()
    assert _pools(db) == 3
    res = gpufleet("db", "restore", str(tmp_path / "b.db"), "--database-url", url, "--yes")
    assert res.returncode == 0, res.stderr
    assert _pools(db) == 2
    (tmp_path / "junk.db").write_text("not a database")
    bad = gpufleet("db", "restore", str(tmp_path / "junk.db"), "--database-url", url, "--yes")
    assert bad.returncode == 1 and "not a gpufleet" in bad.stderr


@pytest.mark.skipif(shutil.which("pg_dump") is not None, reason="pg_dump installed: it would run")
def test_postgres_backup_without_pg_dump_prints_the_command(tmp_path: Path) -> None:
    res = gpufleet(
        "db", "backup", str(tmp_path / "b.dump"), "--database-url", "postgresql+psycopg://u:pw@db/gf"
    )
    assert res.returncode == 1
    assert "pg_dump --format=custom --file" in res.stderr and "postgresql://u:***@db/gf" in res.stderr
