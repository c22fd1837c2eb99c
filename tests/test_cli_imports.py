"""The client commands stay a fast client: ``gpufleet queue`` (run as often as
``squeue``) and the other API commands import no server code, no SQLAlchemy, FastAPI,
uvicorn or Alembic (the server's modules are imported by ``server``, ``db`` and
``admin create-user --database-url`` only when they run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("sqlalchemy", "fastapi", "uvicorn", "alembic", "starlette", "psycopg")
SERVER_OK = {"gpufleet.server", "gpufleet.server.defaults", "gpufleet.server.health", "gpufleet.server.clock"}
"""Constants the ``server`` command's options show (the package itself imports nothing).
The request and reply models the client validates with are ``gpufleet.api``: plain
Pydantic, outside the server."""


@pytest.mark.parametrize("argv", [["queue", "--help"], ["submit", "--help"], ["jobs", "show", "--help"]])
def test_client_commands_import_no_server_machinery(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpufleet", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    modules = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    server = sorted(m for m in modules if m.startswith("gpufleet.server") and m not in SERVER_OK)
    assert not heavy and not server, (heavy[:10], server)
