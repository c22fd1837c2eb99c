"""Join tokens are single-use and expire (issue 29, finding 9), against a real
``gpufleet server --tls-cert`` on SQLite and PostgreSQL: a second enrolment with the
same token is refused, so is an expired one, of concurrent enrolments exactly one wins,
``node join-token --ttl`` sets the expiry and ``node credentials`` shows used and
expired tokens. Without TLS a join token stays the node's credential for its syncs
(the decision in ``services/nodecreds.py``): the expiry bounds enrolment only."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent import AgentTransportError
from gpufleet.agent.enroll import ensure_certificate
from gpufleet.pki import new_key, node_csr
from server.conftest import Server, gpufleet, ok, scratch_postgres, start_server, stop_server, unique

RACERS = 8


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def tls_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("join")
    made = gpufleet("ca", "init", str(work / "pki"), "--name", "127.0.0.1", "--name", "localhost")
    assert made.returncode == 0, made.stderr
    if request.param == "sqlite":
        srv = start_server(f"sqlite:///{work / 'gpufleet.db'}", tls_dir=work / "pki")
        yield srv
        stop_server(srv)
        return
    with scratch_postgres("joincreds") as url:
        srv = start_server(url, tls_dir=work / "pki")
        yield srv
        stop_server(srv)


def _join(srv: Server, node: str, **extra: Any) -> dict[str, Any]:
    with srv.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": "default", "gpus": []}))
        return dict(ok(c.post("/nodes/join-tokens", json={"node": node, **extra}), 201))


def _enrol(srv: Server, node: str, token: str) -> httpx.Response:
    """One certificate request with ``token`` (a fresh key each time)."""
    assert srv.ca_file is not None
    body = {"csr": node_csr(new_key(), node).decode()}
    with httpx.Client(verify=ssl.create_default_context(cafile=srv.ca_file), timeout=30) as http:
        return http.post(
            f"{srv.url}/v1/nodes/{node}/certificate", json=body, headers={"Authorization": f"Bearer {token}"}
        )


def _listed(srv: Server, node: str) -> dict[str, Any]:
    with srv.client() as c:
        items = ok(c.get("/node-credentials", params={"node": node}))["items"]
    return dict(next(i for i in items if i["kind"] == "join-token"))


def _state(srv: Server, node: str) -> str:
    done = gpufleet("node", "credentials", "--node", node, env=srv.env())
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("join-token"))
    return line.split()[-1]


def test_a_join_token_buys_one_certificate(tls_server: Server, tmp_path: Path) -> None:
    node = unique("once")
    token = str(_join(tls_server, node)["token"])
    ensure_certificate(
        url=tls_server.url, node=node, directory=tmp_path / "a", token=token, ca_file=tls_server.ca_file
    )
    again = _enrol(tls_server, node, token)
    assert again.status_code == 401, again.text
    assert again.headers["content-type"] == "application/problem+json"
    assert "used to enrol" in again.json()["detail"]
    with pytest.raises(AgentTransportError) as refused:  # the agent says what to do
        ensure_certificate(
            url=tls_server.url, node=node, directory=tmp_path / "b", token=token, ca_file=tls_server.ca_file
        )
    assert refused.value.status == 401 and "gpufleet node join-token --node" in str(refused.value)
    assert _listed(tls_server, node)["used_at"] is not None
    assert _state(tls_server, node) == "used"
    with tls_server.client() as c:
        certs = [
            i
            for i in ok(c.get("/node-credentials", params={"node": node}))["items"]
            if i["kind"] == "certificate"
        ]
    assert len(certs) == 1  # the refused requests recorded none


def test_an_expired_join_token_is_refused(tls_server: Server) -> None:
    node = unique("late")
    made = _join(tls_server, node, ttl=1)
    assert made["expires_at"] == pytest.approx(made["created_at"] + 1)
    time.sleep(1.2)
    late = _enrol(tls_server, node, str(made["token"]))
    assert late.status_code == 401 and "expired" in late.json()["detail"], late.text
    assert _state(tls_server, node) == "expired"
    assert _listed(tls_server, node)["used_at"] is None


def test_concurrent_enrolments_have_one_winner(tls_server: Server) -> None:
    node = unique("race")
    token = str(_join(tls_server, node)["token"])
    start = threading.Barrier(RACERS)
    codes: list[int] = []

    def racer() -> None:
        start.wait()
        codes.append(_enrol(tls_server, node, token).status_code)

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(codes) == [201] + [401] * (RACERS - 1), codes
    with tls_server.client() as c:
        items = ok(c.get("/node-credentials", params={"node": node}))["items"]
    assert [i["kind"] for i in items].count("certificate") == 1


def test_the_ttl_flag_sets_the_expiry(tls_server: Server) -> None:
    node = unique("ttl")
    with tls_server.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": "default", "gpus": []}))
    before = time.time()
    done = gpufleet("node", "join-token", "--node", node, "--ttl", "2h", env=tls_server.env())
    assert done.returncode == 0 and done.stdout.strip().startswith("gfn_"), done.stderr
    listed = _listed(tls_server, node)
    assert before + 7200 - 5 <= listed["expires_at"] <= time.time() + 7200 + 5
    assert _state(tls_server, node) == "active"
    default = _join(tls_server, unique("ttl"))
    assert default["expires_at"] == pytest.approx(default["created_at"] + 3600)
    bad = gpufleet("node", "join-token", "--ttl", "soon", env=tls_server.env())
    assert bad.returncode == 2 and "--ttl" in bad.stderr
    with tls_server.client() as c:
        for ttl in (0, -5, 10**9):
            assert c.post("/nodes/join-tokens", json={"ttl": ttl}).status_code == 422


def test_without_tls_a_join_token_still_syncs_after_its_expiry(tmp_path: Path) -> None:
    """The decision: a plain-HTTP agent's join token is its node's only credential."""
    srv = start_server(f"sqlite:///{tmp_path / 'plain.db'}")
    try:
        node = unique("plain")
        token = str(_join(srv, node, ttl=1)["token"])
        time.sleep(1.2)
        body = {"gpus": [{"index": 0, "uuid": "GPU-p-0", "model": "H100", "memory_mb": 81559}]}
        r = httpx.post(
            f"{srv.url}/v1/nodes/{node}/sync",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    finally:
        stop_server(srv)
