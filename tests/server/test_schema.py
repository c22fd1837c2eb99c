"""Migrations and the server's refusal to run on a schema that is not its own."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from gpufleet.server.store.db import alembic_config, head_revision, make_engine, upgrade
from server.conftest import free_port, gpufleet, scratch_postgres


def upgrade_down(url: str, revision: str) -> None:
    from alembic import command

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        engine.dispose()


def start(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", "server", "--port", str(free_port()), "--database-url", db_url],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_an_empty_database_gets_the_schema_at_first_start(tmp_path: Path) -> None:
    """A new user's ``gpufleet server`` on a new database just starts (issue 20)."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "created the schema" in err and "created user 'admin'" in err, err
    engine = create_engine(url)
    with engine.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()
    engine.dispose()


def test_refuses_a_database_with_tables_but_no_revision(tmp_path: Path) -> None:
    """Not empty, not gpufleet's (or from before migrations): the server creates nothing."""
    url = f"sqlite:///{tmp_path / 'other.db'}"
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("CREATE TABLE someone_elses (x INTEGER)"))
    engine.dispose()
    res = start(url)
    assert res.returncode == 1
    assert "not initialised" in res.stderr and "gpufleet db upgrade" in res.stderr
    assert "Traceback" not in res.stderr


def test_refuses_an_older_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'older.db'}"
    assert gpufleet("db", "upgrade", "--database-url", url).returncode == 0
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '0009'"))
    engine.dispose()
    res = start(url)
    assert res.returncode == 1
    assert "at revision 0009" in res.stderr and "gpufleet db upgrade" in res.stderr


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


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_0010_marks_the_only_team_of_a_user_as_their_default(tmp_path: Path, backend: str) -> None:
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'm.db'}"
        else:
            url = stack.enter_context(scratch_postgres("m0010"))
        upgrade(url, "0009")
        engine = create_engine(url)
        stack.callback(engine.dispose)
        with engine.begin() as c:
            c.execute(text("INSERT INTO teams (id, name) VALUES (1, 'a'), (2, 'b')"))
            c.execute(text("INSERT INTO users (id, name, role, created_at) VALUES (1, 'one', 'user', 0), "
                           "(2, 'two', 'user', 0)"))  # fmt: skip
            c.execute(text("INSERT INTO memberships (user_id, team_id) VALUES (1, 1), (2, 1), (2, 2)"))
        upgrade(url)
        with engine.connect() as c:
            rows = c.execute(text("SELECT user_id, team_id, is_default FROM memberships ORDER BY 1, 2")).all()
        assert [(u, t, bool(d)) for u, t, d in rows] == [(1, 1, True), (2, 1, False), (2, 2, False)]
        upgrade_down(url, "0009")
        with engine.connect() as c:
            assert c.execute(text("SELECT COUNT(*) FROM memberships")).scalar() == 3
