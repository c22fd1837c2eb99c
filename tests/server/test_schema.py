"""Migrations and the server's refusal to run on a schema that is not its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from server.conftest import free_port, gpufleet


def start(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", "server", "--port", str(free_port()), "--database-url", db_url],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_refuses_unmigrated_database(tmp_path: Path) -> None:
    res = start(f"sqlite:///{tmp_path / 'empty.db'}")
    assert res.returncode == 1
    assert "not initialised: run `gpufleet db upgrade" in res.stderr
    assert "Traceback" not in res.stderr


def test_refuses_newer_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    assert gpufleet("db", "upgrade", "--database-url", url).returncode == 0
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    res = start(url)
    assert res.returncode == 1
    assert "newer than this gpufleet" in res.stderr


@pytest.mark.parametrize("times", [1, 2], ids=["once", "twice-is-harmless"])
def test_db_upgrade_and_direct_create_user(tmp_path: Path, times: int) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    for _ in range(times):
        res = gpufleet("db", "upgrade", "--database-url", url)
        assert res.returncode == 0, res.stderr
    made = gpufleet("admin", "create-user", "alice", "--role", "operator", "--database-url", url)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().startswith("gf_")
    dup = gpufleet("admin", "create-user", "alice", "--database-url", url)
    assert dup.returncode == 1 and "exists" in dup.stderr
