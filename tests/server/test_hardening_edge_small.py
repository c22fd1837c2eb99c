"""The smaller findings of issue 29 (13): a body cut short is no 500; team membership is
its members' (and operators') to see; a service spec with a key given twice is refused;
``--gres=gpu:`` is refused as Slurm does; names and environments are bounded and hold no
control or format characters (bidirectional overrides)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
from sqlalchemy import text

from gpufleet.cli.sbatch import parse_script
from gpufleet.cli.servicespec import read_spec_file
from server.conftest import ADMIN_TOKEN, Server, make_pool, make_team, make_user, ok

# -- a body cut short ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/users"], ids=["submit", "a-route"])
def test_a_body_cut_short_is_not_a_500(server: Server, path: str) -> None:
    """The client promises 1,000 bytes, sends 10 and goes: no audit row says 500 (nothing
    was done: admission never let the request in; a route that met it would answer 400)."""
    where = urlsplit(server.url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with server.engine.connect() as c:
        before = c.execute(text("SELECT COALESCE(MAX(id), 0) FROM audit")).scalar_one()
    with socket.create_connection((where.hostname, where.port), timeout=5) as s:
        s.sendall(head.encode() + b'{"name": "')
        time.sleep(0.2)
    time.sleep(1.0)  # audit rows of refusals are gathered for 0.1 s
    with server.engine.connect() as c:
        rows = c.execute(
            text("SELECT status FROM audit WHERE path = :p AND id > :b"), {"p": path, "b": before}
        )
        statuses = [r[0] for r in rows]
    assert all(s < 500 for s in statuses), statuses


# -- team membership -------------------------------------------------------------------------


def test_team_members_are_shown_to_members_and_operators_only(server: Server) -> None:
    mine, theirs = make_team(server), make_team(server)
    insider = make_user(server, team=theirs)
    outsider = make_user(server, team=mine)
    operator = make_user(server, role="operator", team=mine)
    seen = {}
    for who, token in (("insider", insider), ("outsider", outsider), ("operator", operator)):
        with server.client(token) as c:
            one = ok(c.get(f"/teams/{theirs}"))["members"]
            listed = next(
                t for t in ok(c.get("/teams", params={"limit": 1000}))["items"] if t["name"] == theirs
            )
            seen[who] = (len(one), len(listed["members"]))
    assert seen["outsider"] == (0, 0)
    assert seen["insider"] == seen["operator"] == (2, 2)  # the admin and the insider


# -- a service spec with a key given twice ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "body", "needle"),
    [
        (
            "s.yaml",
            "name: a\nreplicas: 1\ncommand: [x]\nreplicas: 3\n",
            "'replicas' is given twice (lines 2 and 4)",
        ),
        ("s.yaml", "name: a\nenv:\n  A: '1'\n  A: '2'\n", "'A' is given twice (lines 3 and 4)"),
        ("s.json", '{"name": "a", "name": "b"}', "'name' is given twice"),
    ],
    ids=["yaml-top-level", "yaml-nested-env", "json"],
)
def test_a_spec_with_a_key_given_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, body: str, needle: str
) -> None:
    spec = tmp_path / name
    spec.write_text(body)
    with pytest.raises(typer.Exit):
        read_spec_file(str(spec))
    assert needle in capsys.readouterr().err


# -- --gres ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gres", ["gpu:", "gpu::2", "gpu:a100:", "gpu:,gpu:1"])
def test_a_gres_with_an_empty_count_or_type_is_refused(gres: str) -> None:
    got = parse_script(f"#!/bin/bash\n#SBATCH --gres={gres}\n", now=1_800_000_000.0)
    assert any(f"--gres={gres}" in p.text for p in got.problems), got.problems
    assert got.gpus_per_node is None


# -- names and environments ------------------------------------------------------------------

BIDI = ["\u202e", "\u2066", "\u200b", "\ufeff", "\x1b"]


def _job(**spec: Any) -> dict[str, Any]:
    return {"command": ["true"], **spec}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        *[
            pytest.param("/jobs", _job(name=f"report{c}gnp.exe"), "name", id=f"job-name-U+{ord(c):04X}")
            for c in BIDI
        ],
        pytest.param("/jobs", _job(env={"K" * 100_000: "v"}), "env", id="env-key-100k"),
        pytest.param("/jobs", _job(env={"A=B": "v"}), "env", id="env-key-with-equals"),
        pytest.param("/jobs", _job(env={"A\u202eB": "v"}), "env", id="env-key-bidi"),
        pytest.param("/jobs", _job(env={f"K{i}": "v" for i in range(1025)}), "env", id="env-1025-vars"),
        pytest.param("/tokens", {"name": "ci\u202e"}, "name", id="token-name"),
        pytest.param(
            "/reservations",
            {"gpus": 1, "start": 1.9e9, "duration_s": 3600, "name": "x\u2067y"},
            "name",
            id="reservation-name",
        ),
    ],
)
def test_names_and_env_refuse_format_characters_and_huge_keys(
    server: Server, path: str, body: dict[str, Any], field: str
) -> None:
    with server.client() as c:
        resp = c.post(path, json=body)
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    problem = resp.json()
    assert problem["detail"].startswith(field), problem["detail"]
    assert len(resp.content) < 4096  # a 100,000-character key is not echoed back whole
    # nor is a control or format character: an answer cannot reorder what a terminal shows
    assert not any(not ch.isprintable() for ch in resp.text), ascii(resp.text[:300])


def test_plain_unicode_names_are_fine(server: Server) -> None:
    with server.client() as c:
        job = ok(
            c.post("/jobs", json=_job(name="naïve 日本語 job", pool=make_pool(server), env={"Ä": "1"})), 201
        )
    assert job["name"] == "naïve 日本語 job"
