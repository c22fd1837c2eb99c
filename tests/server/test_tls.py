"""TLS for the API and mTLS for agents, against a real ``gpufleet server --tls-cert``:
the CLI over HTTPS with the cluster CA, an agent trading its join token for a node
certificate and syncing with it, a join token refused for syncs, a certificate that
speaks only for its node, revocation at once, a foreign CA refused at the handshake,
and plain HTTP on a non-loopback address refused at start."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.agent import AgentTransportError, HttpTransport
from gpufleet.agent.enroll import ensure_certificate
from gpufleet.pki import CertificateAuthority, certificate_node, key_pem, new_key, node_csr
from server.conftest import Server, gpufleet, ok, start_server, stop_server, unique


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("tls")
    made = gpufleet("ca", "init", str(work / "pki"), "--name", "127.0.0.1", "--name", "localhost")
    assert made.returncode == 0, made.stderr
    srv = start_server(f"sqlite:///{work / 'gpufleet.db'}", tls_dir=work / "pki")
    yield srv
    stop_server(srv)


def _join(srv: Server, node: str) -> str:
    with srv.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": "default", "gpus": []}))
        return str(ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"])


def _sync_body() -> dict[str, object]:
    return {"gpus": [{"index": 0, "uuid": "GPU-t-0", "model": "H100", "memory_mb": 81559}]}


def test_the_cli_speaks_https_with_the_cluster_ca(tls_server: Server) -> None:
    done = gpufleet("nodes", env=tls_server.env())
    assert done.returncode == 0, done.stderr
    untrusted = gpufleet("nodes", env={**tls_server.env(), "GPUFLEET_CA_FILE": ""})
    assert untrusted.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    plain = tls_server.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(plain + "/v1/healthz", timeout=2)


def test_an_agent_enrols_and_syncs_with_its_certificate(tls_server: Server, tmp_path: Path) -> None:
    node = unique("mtls")
    token = _join(tls_server, node)
    crt, key = ensure_certificate(
        url=tls_server.url, node=node, directory=tmp_path / "pki", token=token, ca_file=tls_server.ca_file
    )
    held = certificate_node(Path(crt).read_bytes())
    assert held is not None and held.node == node
    assert (tmp_path / "pki" / "node.key").stat().st_mode & 0o077 == 0
    agent = HttpTransport(tls_server.url, ca_file=tls_server.ca_file, cert=(crt, key))
    try:
        reply = agent.sync(node, _sync_body())
        assert reply["node"] == node
        with pytest.raises(AgentTransportError) as other:  # a certificate speaks for its node only
            agent.sync(unique("someone-else"), _sync_body())
        assert other.value.status == 403
    finally:
        agent.close()
    # the second start reuses the certificate: no token needed
    again = ensure_certificate(
        url=tls_server.url, node=node, directory=tmp_path / "pki", token=None, ca_file=tls_server.ca_file
    )
    assert again == (crt, key)
    with tls_server.client() as c:
        listed = ok(c.get("/node-credentials", params={"node": node}))["items"]
    assert [(i["kind"], i["revoked_at"]) for i in listed] == [("join-token", None), ("certificate", None)]
    assert listed[1]["hint"] == held.serial


def test_a_join_token_only_buys_the_certificate(tls_server: Server) -> None:
    node = unique("tok")
    token = _join(tls_server, node)
    with httpx.Client(verify=ssl.create_default_context(cafile=tls_server.ca_file)) as http:
        r = http.post(
            f"{tls_server.url}/v1/nodes/{node}/sync",
            json=_sync_body(),
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == 401 and "node certificates" in r.json()["detail"]


@pytest.mark.parametrize(
    ("csr", "status"),
    [
        ("not a csr", 422),
        ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", 422),
    ],
    ids=["garbage", "bad-pem"],
)
def test_a_bad_csr_is_refused(tls_server: Server, csr: str, status: int) -> None:
    node = unique("csr")
    token = _join(tls_server, node)
    with httpx.Client(verify=ssl.create_default_context(cafile=tls_server.ca_file)) as http:
        r = http.post(
            f"{tls_server.url}/v1/nodes/{node}/certificate",
            json={"csr": csr},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == status and r.headers["content-type"] == "application/problem+json"


def test_revoking_a_node_refuses_its_next_sync(tls_server: Server, tmp_path: Path) -> None:
    node = unique("rev")
    token = _join(tls_server, node)
    cert = ensure_certificate(
        url=tls_server.url, node=node, directory=tmp_path, token=token, ca_file=tls_server.ca_file
    )
    agent = HttpTransport(tls_server.url, ca_file=tls_server.ca_file, cert=cert)
    try:
        agent.sync(node, _sync_body())
        done = gpufleet("node", "revoke", node, env=tls_server.env())
        assert done.returncode == 0 and "and 1 certificate of" in done.stdout, done.stderr
        with pytest.raises(AgentTransportError) as refused:
            agent.sync(node, _sync_body())
        assert refused.value.status == 401 and "revoked" in str(refused.value)
    finally:
        agent.close()
    with pytest.raises(AgentTransportError):  # nor can the revoked token buy a new one
        ensure_certificate(
            url=tls_server.url, node=node, directory=tmp_path / "new", token=token, ca_file=tls_server.ca_file
        )
    listed = gpufleet("node", "credentials", "--node", node, env=tls_server.env())
    assert listed.stdout.count("revoked") == 2, listed.stdout


def test_a_certificate_from_another_ca_is_refused(tls_server: Server, tmp_path: Path) -> None:
    rogue = CertificateAuthority.create(tmp_path / "rogue")
    key = new_key()
    issued = rogue.sign_node(node_csr(key, "evil"), node="evil")
    (tmp_path / "evil.crt").write_bytes(issued.certificate)
    (tmp_path / "evil.key").write_bytes(key_pem(key))
    agent = HttpTransport(
        tls_server.url,
        ca_file=tls_server.ca_file,
        cert=(str(tmp_path / "evil.crt"), str(tmp_path / "evil.key")),
    )
    try:
        with pytest.raises(AgentTransportError) as refused:
            agent.sync("evil", _sync_body())
        assert refused.value.status is None  # the handshake failed: no HTTP answer at all
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("--host", "0.0.0.0"), "--insecure-http"),
        (("--tls-key", "/nonexistent"), "go with --tls-cert"),
        (("--tls-cert", "/nonexistent/server.crt"), "no such file"),
    ],
    ids=["plain-http-on-all-addresses", "key-without-cert", "missing-cert"],
)
def test_the_server_refuses_unsafe_or_broken_tls_settings(args: tuple[str, ...], want: str) -> None:
    done = gpufleet("server", "--port", "1", "--database-url", "sqlite://", *args)
    assert done.returncode == 2 and want in done.stderr
