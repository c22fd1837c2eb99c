"""API tokens: stored as HMAC with the server's key (legacy sha256 rows accepted once and
rewritten), expiry (API tokens, web sessions, a shorter lifetime asked for), and the last
active admin token that cannot be revoked. Against a real server on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from gpufleet.server.store.tokenkey import TokenHasher, load_hasher
from server.conftest import (
    ADMIN_TOKEN,
    Server,
    gpufleet,
    make_pool,
    make_team,
    make_user,
    ok,
    scratch_postgres,
    start_server,
    stop_server,
    unique,
)
from server.playnode import gpu_list, sync

DAY = 86400.0


def hasher(srv: Server) -> TokenHasher:
    """The session server runs with the default key: the same rule finds it here."""
    return load_hasher(database_url=srv.db_url)


def stored_hash(srv: Server, table: str, row_id: int) -> str:
    with srv.engine.connect() as c:
        return str(
            c.execute(text(f"SELECT token_hash FROM {table} WHERE id = :i"), {"i": row_id}).scalar_one()
        )


def me(srv: Server, token: str) -> Any:
    with srv.client(token) as c:
        return c.get("/users/me")


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def test_rows_hold_the_hmac_not_the_sha256(server: Server, team: str) -> None:
    token = make_user(server, team=team)
    with server.client(token) as c:
        made = ok(c.post("/tokens", json={"name": "ci"}), 201)
        session = ok(c.post("/sessions"), 201)
    with server.client() as c:
        join = ok(c.post("/nodes/join-tokens", json={"node": unique("n")}), 201)
    with server.engine.connect() as c:
        hashes = set(c.execute(text("SELECT token_hash FROM tokens")).scalars())
        hashes |= set(c.execute(text("SELECT token_hash FROM node_credentials")).scalars())
    for tok in (token, made["token"], session["token"], join["token"]):
        assert hashlib.sha256(tok.encode()).hexdigest() not in hashes
        assert hasher(server).digest(tok) in hashes


@pytest.mark.parametrize(
    ("table", "prefix"), [("tokens", "gf_"), ("node_credentials", "gfn_")], ids=["api-token", "join-token"]
)
def test_legacy_sha256_row_is_accepted_and_rewritten(
    server: Server, team: str, table: str, prefix: str
) -> None:
    token = prefix + "legacy" + unique("x")
    legacy = hashlib.sha256(token.encode()).hexdigest()
    node = unique("legacy")
    if table == "node_credentials":
        with server.client() as c:
            ok(c.put(f"/nodes/{node}", json={"pool": make_pool(server), "gpus": gpu_list(1, node=node)}))
    with server.engine.begin() as c:
        if table == "tokens":
            uid = c.execute(text("SELECT id FROM users WHERE name = 'admin'")).scalar_one()
            c.execute(
                text(
                    "INSERT INTO tokens (user_id, name, token_hash, hint, created_at, expires_at, kind) "
                    "VALUES (:u, 'old', :h, 'xxxx', :t, :e, 'api')"
                ),
                {"u": uid, "h": legacy, "t": time.time(), "e": time.time() + DAY},
            )
        else:
            c.execute(
                text(
                    "INSERT INTO node_credentials (node, token_hash, hint, created_by, created_at) "
                    "VALUES (:n, :h, 'xxxx', 'admin', :t)"
                ),
                {"n": node, "h": legacy, "t": time.time()},
            )
        row_id = c.execute(text(f"SELECT id FROM {table} WHERE token_hash = :h"), {"h": legacy}).scalar_one()

    def use() -> None:
        if table == "tokens":
            assert me(server, token).status_code == 200
        else:
            sync(server, node, {"gpus": gpu_list(1, node=node), "jobs": []}, token=token)

    use()
    assert stored_hash(server, table, row_id) == hasher(server).digest(token)
    use()  # and it goes on working under the HMAC


@pytest.mark.parametrize(
    ("expires_in", "status"),
    [(0, 422), (-5, 422), ("91d", 422), ("soon", 422), ("1h", 201), (120, 201)],
    ids=["zero", "negative", "past-token-ttl", "not-a-duration", "one-hour", "seconds"],
)
def test_a_token_may_ask_for_a_shorter_lifetime(server: Server, expires_in: object, status: int) -> None:
    with server.client() as c:
        resp = c.post("/tokens", json={"name": "short", "expires_in": expires_in})
    assert resp.status_code == status, resp.text
    if status == 201:
        made = resp.json()
        want = 3600 if expires_in == "1h" else 120
        assert made["expires_at"] == pytest.approx(made["created_at"] + want)
        with server.client() as c:
            ok(c.delete(f"/tokens/{made['id']}"))


def test_an_expired_token_is_refused_with_a_clear_detail(server: Server, team: str) -> None:
    token = make_user(server, team=team)
    with server.client(token) as c:
        short = ok(c.post("/tokens", json={"name": "brief", "expires_in": 1}), 201)["token"]
    assert me(server, short).status_code == 200  # and now in the server's token cache
    time.sleep(1.3)
    refused = me(server, short)
    assert refused.status_code == 401
    assert refused.json()["detail"].startswith("token expired at ")
    assert me(server, token).status_code == 200


def test_default_lifetimes_and_the_bootstrap_token(server: Server, team: str) -> None:
    token = make_user(server, team=team)
    with server.client(token) as c:
        mine = ok(c.get("/tokens"))["items"]
        session = ok(c.post("/sessions"), 201)
    assert [t["kind"] for t in mine] == ["api"]
    assert mine[0]["expires_at"] == pytest.approx(mine[0]["created_at"] + 90 * DAY)
    assert session["kind"] == "session"
    assert session["expires_at"] == pytest.approx(session["created_at"] + 12 * 3600)
    with server.client() as c:
        boot = [
            t for t in ok(c.get("/tokens", params={"user": "admin"}))["items"] if t["kind"] == "bootstrap"
        ]
    assert len(boot) == 1 and boot[0]["expires_at"] is None


def test_a_session_never_outlives_its_api_token(server: Server) -> None:
    with server.client() as c:
        brief = ok(c.post("/tokens", json={"name": "brief", "expires_in": 60}), 201)
    with server.client(brief["token"]) as c:
        session = ok(c.post("/sessions"), 201)
    assert session["expires_at"] == pytest.approx(brief["expires_at"])


@pytest.mark.parametrize(
    ("path", "body"), [("/tokens", {"name": "x"}), ("/sessions", None)], ids=["token", "session"]
)
def test_a_web_session_mints_nothing(server: Server, team: str, path: str, body: Any) -> None:
    with server.client(make_user(server, team=team)) as c:
        session = ok(c.post("/sessions"), 201)["token"]
    with server.client(session) as c:
        assert ok(c.get("/users/me"))["role"] == "user"
        assert c.post(path, json=body).status_code == 403


def test_cli_shows_kind_and_expiry(server: Server) -> None:
    out = gpufleet("tokens", "list", env=server.env())
    assert out.returncode == 0, out.stderr
    assert "EXPIRES" in out.stdout and "bootstrap" in out.stdout and "never" in out.stdout
    made = gpufleet("tokens", "create", "--name", "cli-ttl", "--ttl", "2h", env=server.env())
    assert made.returncode == 0, made.stderr
    listed = gpufleet("tokens", "list", "--json", env=server.env())
    assert listed.returncode == 0, listed.stderr
    row = next(t for t in json.loads(listed.stdout) if t["name"] == "cli-ttl")
    assert row["expires_at"] == pytest.approx(row["created_at"] + 7200)


# -- the last admin token, on a server of its own (it revokes the bootstrap token) -----------


@pytest.fixture(params=["sqlite", "postgresql"])
def lone(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'lone.db'}"
        else:
            url = stack.enter_context(scratch_postgres("lone"))
        srv = start_server(url, extra=("--token-secret-file", str(tmp_path / "secret")))
        stack.callback(stop_server, srv)
        yield srv


def test_the_last_active_admin_token_cannot_be_revoked(lone: Server, tmp_path: Path) -> None:
    def revoke(token: str, token_id: int) -> Any:
        with lone.client(token) as c:
            return c.delete(f"/tokens/{token_id}")

    refused = revoke(ADMIN_TOKEN, 1)
    assert refused.status_code == 409 and "last active admin token" in refused.json()["detail"]
    with lone.client() as c:
        second = ok(c.post("/tokens", json={"name": "second"}), 201)
    assert ok(revoke(second["token"], 1))["revoked"] is True  # another one is active: fine
    with lone.client(second["token"]) as c:
        session = ok(c.post("/sessions"), 201)  # a session is no admin token
        short = ok(c.post("/tokens", json={"name": "brief", "expires_in": 1}), 201)
    time.sleep(1.2)  # an expired one is not either
    refused = revoke(second["token"], second["id"])
    assert refused.status_code == 409
    assert ok(revoke(second["token"], session["id"]))["revoked"] is True
    assert ok(revoke(second["token"], short["id"]))["revoked"] is True
    assert me(lone, second["token"]).status_code == 200
    # the stored digest is the HMAC under the secret the server was given
    key = TokenHasher((tmp_path / "secret").read_text().strip().encode())
    assert stored_hash(lone, "tokens", second["id"]) == key.digest(second["token"])
