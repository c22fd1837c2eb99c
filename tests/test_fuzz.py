"""A bounded schemathesis pass over every operation of ``/openapi.json`` against a real
``gpufleet server``, on SQLite and on PostgreSQL (``GPUFLEET_TEST_DATABASE_URL``; there an
id beyond 2^31 was a 500 where SQLite answered 404: issue 29): any 5xx or any response
that does not match the declared schema fails the test. Seeded, one worker, a time
budget per backend (``FUZZ_SECONDS``), so a CI run is repeatable and bounded (two
passes, under a minute in all); ``GPUFLEET_FUZZ_SECONDS`` lengthens it for a deeper run.

Left out of the pass: revoking credentials (``DELETE /v1/tokens/{id}``, node revoke),
since a fuzzer that revokes its own token spends the rest of its budget on 401s; they
have their own tests (``tests/server/test_tokens*.py``, ``test_tls.py``); and a job's
logs, whose ``?follow=true`` stays open while the job lives, as ``tail -f`` does (the
fuzzer's jobs, service replicas among them, never end: its read timed out), tested in
``tests/agent/test_sync.py`` and ``tests/server/test_sync_scope.py``. The server is
started with rate limits high enough that the fuzzer is never throttled."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.conftest import ADMIN_TOKEN, Server, scratch_postgres, start_server, stop_server

pytest.importorskip("schemathesis", reason="schemathesis not installed (pip install -e '.[dev,fuzz]')")

FUZZ_SECONDS = int(os.environ.get("GPUFLEET_FUZZ_SECONDS", "18"))
ST = Path(sys.executable).parent / "st"
EXCLUDED = r"^/v1/(tokens/\{[a-z_]+\}|nodes/\{name\}/revoke|jobs/\{job_id\}/logs)$"


SERVER_OPTIONS = ("--rate-admin", "off", "--auth-failures", "off")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'gpufleet.db'}"
        else:
            url = stack.enter_context(scratch_postgres("fuzz"))
        srv = start_server(url, extra=SERVER_OPTIONS)
        try:
            yield srv
        finally:
            stop_server(srv)


def test_no_operation_answers_5xx_or_breaks_its_schema(fuzz_server: Server, tmp_path: Path) -> None:
    args = [
        str(ST),
        "run",
        fuzz_server.url + "/openapi.json",
        "--header",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        "--checks",
        "not_a_server_error,response_schema_conformance",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-time",
        str(FUZZ_SECONDS),
        "--workers",
        "1",
        "--seed",
        "20261203",
        "--exclude-path-regex",
        EXCLUDED,
        "--request-timeout",
        "30",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=FUZZ_SECONDS + 240, check=False, cwd=tmp_path
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-12_000:]
    assert "Selected:" in out and "Tested:" in out, out[-4000:]
