"""Secrets at rest and in the open: database, backup and token-secret files are 0600,
SQL errors never carry their bound values (job env), ``/metrics`` takes an operator's
token unless ``--metrics-public``, the per-team cost series can be turned off, and a
server refuses a token secret that does not match the database or that others can read."""

from __future__ import annotations

import ast
import contextlib
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from gpufleet.server.errors import TokenKeyError
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import Setting
from gpufleet.server.store.tokenkey import TokenHasher, load_hasher
from server.conftest import (
    ADMIN_TOKEN,
    Server,
    free_port,
    gpufleet,
    make_team,
    make_user,
    ok,
    scratch_postgres,
    start_server,
    stop_server,
)

COST_SERIES = ("gpufleet_team_cost_accrued", "gpufleet_team_gpu_hours", "gpufleet_team_energy_kwh")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def series(body: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(body) for s in fam.samples}


# -- files --------------------------------------------------------------------------------------


def test_sqlite_database_wal_shm_and_secret_are_private(server: Server) -> None:
    if make_url(server.db_url).get_backend_name() != "sqlite":
        pytest.skip("SQLite files only")
    db = Path(str(make_url(server.db_url).database))
    with server.client() as c:
        ok(c.post("/sessions"), 201)  # a write: the WAL exists
    files = [
        db,
        db.with_name(db.name + "-wal"),
        db.with_name(db.name + "-shm"),
        db.with_name(db.name + ".token-secret"),
    ]
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}


def test_existing_world_readable_database_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite3.connect(path).close()
    path.chmod(0o644)
    up = gpufleet("db", "upgrade", "--database-url", f"sqlite:///{path}")
    assert up.returncode == 0, up.stderr
    assert mode(path) == 0o600


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_backup_file_is_private(server: Server, tmp_path: Path, umask: int) -> None:
    out = tmp_path / "backup.db"
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet", "db", "backup", str(out), "--database-url", server.db_url],
        capture_output=True,
        text=True,
        timeout=60,
        umask=umask,
    )
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 0 and mode(out) == 0o600


# -- logs ---------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def scratch_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dbmod.Database]:
    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 's.db'}"
            if request.param == "sqlite"
            else stack.enter_context(scratch_postgres("secrets"))
        )
        dbmod.upgrade(url)
        db = dbmod.Database.connect(url)
        stack.callback(db.dispose)
        yield db


def test_sql_errors_do_not_carry_bound_values(scratch_db: dbmod.Database) -> None:
    secret = "hunter2-job-env-value"
    with scratch_db.write() as s:
        s.add(Setting(name="k", value="v"))
    with pytest.raises(IntegrityError) as failed, scratch_db.write() as s:
        s.add(Setting(name="k", value=secret))
        s.flush()
    assert secret not in str(failed.value) and "hidden" in str(failed.value)


# -- /metrics -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "status"),
    [(None, 401), ("user", 403), ("operator", 200), ("admin", 200)],
    ids=["anonymous", "user", "operator", "admin"],
)
def test_metrics_need_an_operator_token(server: Server, who: str | None, status: int) -> None:
    token = (
        None
        if who is None
        else ADMIN_TOKEN
        if who == "admin"
        else make_user(server, role=who, team=make_team(server))
    )
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    resp = httpx.get(server.url + "/metrics", headers=headers, timeout=30)
    assert resp.status_code == status, resp.text
    if status == 200:
        assert set(COST_SERIES) <= series(resp.text)  # every team has them (make_team made one)


@pytest.fixture(params=["sqlite", "postgresql"])
def quiet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A server with ``--metrics-public --no-team-cost-metrics``."""
    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 'q.db'}"
            if request.param == "sqlite"
            else stack.enter_context(scratch_postgres("quiet"))
        )
        srv = start_server(url, extra=("--metrics-public", "--no-team-cost-metrics"))
        stack.callback(stop_server, srv)
        yield srv


def test_public_metrics_without_team_costs(quiet: Server) -> None:
    team = make_team(quiet)
    with quiet.client() as c:
        ok(c.put(f"/teams/{team}/budget", json={"soft": 1.0, "hard": 2.0}))
    resp = httpx.get(quiet.url + "/metrics", timeout=30)
    assert resp.status_code == 200
    names = series(resp.text)
    assert "gpufleet_scheduling_passes_total" in names  # the rest is there
    assert not {*COST_SERIES, "gpufleet_team_budget"} & names


# -- the token secret ---------------------------------------------------------------------------


def start(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "server",
            "--port",
            str(free_port()),
            "--database-url",
            url,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_TOKEN_SECRET")},
    )


def test_a_server_with_another_secret_refuses_to_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    assert gpufleet("db", "upgrade", "--database-url", url).returncode == 0
    made = gpufleet("admin", "create-user", "ops", "--role", "admin", "--database-url", url)
    assert made.returncode == 0, made.stderr  # with the default secret: its fingerprint is recorded
    other = tmp_path / "other-secret"
    res = start(url, "--token-secret-file", str(other))
    assert res.returncode == 1 and "hashed with another token secret" in res.stderr, res.stderr
    assert mode(other) == 0o600  # made, private


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    assert gpufleet("db", "upgrade", "--database-url", url).returncode == 0
    loose = tmp_path / "loose"
    loose.write_text("x" * 64 + "\n")
    loose.chmod(0o644)
    res = start(url, "--token-secret-file", str(loose))
    assert res.returncode == 1 and "chmod 600" in res.stderr, res.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "p.db")) as c:
        assert c.execute("SELECT COUNT(*) FROM users").fetchone() == (0,)  # nothing was written


@pytest.mark.parametrize(
    ("env", "file", "want"),
    [
        ({}, None, "default"),
        ({"GPUFLEET_TOKEN_SECRET": "e" * 40}, None, "e" * 40),
        ({"GPUFLEET_TOKEN_SECRET": "e" * 40}, "f" * 40, "f" * 40),
        ({"GPUFLEET_TOKEN_SECRET": "short"}, None, TokenKeyError),
        ({}, "short", TokenKeyError),
    ],
    ids=["default-file", "env-secret", "file-wins-over-env", "env-too-short", "file-too-short"],
)
def test_where_the_token_secret_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], file: str | None, want: object
) -> None:
    for k in ("GPUFLEET_TOKEN_SECRET", "GPUFLEET_TOKEN_SECRET_FILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = None
    if file is not None:
        path = tmp_path / "given"
        path.write_text(file + "\n")
        path.chmod(0o600)
    url = f"sqlite:///{tmp_path / 'g.db'}"
    if want is TokenKeyError:
        with pytest.raises(TokenKeyError, match="at least 32"):
            load_hasher(database_url=url, secret_file=path)
        return
    got = load_hasher(database_url=url, secret_file=path)
    if want == "default":
        made = tmp_path / "g.db.token-secret"
        assert mode(made) == 0o600 and got == TokenHasher(made.read_text().strip().encode())
        assert load_hasher(database_url=url) == got  # made once, then read
    else:
        assert got == TokenHasher(str(want).encode())


def _argv_with_a_secret_flag(tree: ast.AST) -> list[int]:
    """Lines of list or tuple literals (a command line being built) holding ``--token``."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.List | ast.Tuple)
        and any(isinstance(e, ast.Constant) and e.value in SECRET_FLAGS for e in node.elts)
    ]


SECRET_FLAGS = ("--token", "--admin-token")


def test_no_process_is_started_with_a_secret_on_its_command_line() -> None:
    """Issue 29, finding 7: every local user reads ``/proc/PID/cmdline``. The gpufleet
    code that starts processes (the demo's server, the scheduling child, job wrappers)
    hands secrets over in a 0600 file, the environment or a pipe, never in argv."""
    src = Path(dbmod.__file__).resolve().parents[1]
    found = {
        str(path.relative_to(src)): lines
        for path in sorted(src.rglob("*.py"))
        if (lines := _argv_with_a_secret_flag(ast.parse(path.read_text())))
    }
    assert found == {}, found
