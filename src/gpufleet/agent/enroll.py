"""The agent's certificate: made once with a join token, then used for every sync.

``ensure_certificate`` keeps ``node.key`` (made here, 0600, never sent anywhere) and
``node.crt`` in the agent's ``pki`` directory. A certificate for this node that is valid
for more than ``RENEW_BEFORE_S`` is used as it is; one close to its end is renewed with
itself as the credential; otherwise (first start, another node's certificate, expired)
the join token buys a new one. A join token buys one certificate, before it expires
(``server/services/nodecreds.py``): a node that lost its key or let its certificate
lapse needs a new token (``gpufleet node join-token --node NODE``). Errors are
``AgentTransportError`` with the reason.

Several servers: nothing here is bound to one. The certificate is signed by the cluster
CA, which every server trusts, so it is asked of the first server that answers. The
request is not idempotent (each one issues and records a certificate), so like any post
it moves on to the next server only when it never reached one (``failover.py``); after
a timeout the agent stops with the error, and its next start asks again (a certificate
whose answer was lost is never used; ``gpufleet node revoke`` ends it with the rest).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from gpufleet.agent.transport import AgentTransportError, HttpTransport
from gpufleet.pki import certificate_node, key_pem, new_key, node_csr

RENEW_BEFORE_S = 30 * 86_400


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def ensure_certificate(
    *,
    url: str | Sequence[str],
    node: str,
    directory: Path,
    token: str | None,
    ca_file: str | None,
    now: float | None = None,
    transport: httpx.BaseTransport | None = None,
) -> tuple[str, str]:
    """(certificate file, key file) for ``node``, requesting one when needed; ``url``: the
    server, or several of one cluster (the first that answers issues it)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    crt, key_file = directory / "node.crt", directory / "node.key"
    now = time.time() if now is None else now
    held = certificate_node(crt.read_bytes()) if crt.exists() and key_file.exists() else None
    usable = held is not None and held.node == node and held.not_after > now
    if usable and held is not None and held.not_after - now > RENEW_BEFORE_S:
        return str(crt), str(key_file)
    if not usable and not token:
        raise AgentTransportError(
            f"node {node} has no valid certificate in {directory}: give a join token "
            "(--token-file) for the first contact"
        )
    key = new_key()
    body = {"csr": node_csr(key, node).decode()}
    client = HttpTransport(
        url,
        None if usable else token,
        ca_file=ca_file,
        cert=(str(crt), str(key_file)) if usable else None,
        transport=transport,
    )
    try:
        got = client.post(f"/nodes/{node}/certificate", body)
    except AgentTransportError as exc:
        if exc.status != 401 or usable:
            raise
        raise AgentTransportError(
            f"the join token bought no certificate: {exc}; make a new one with "
            f"gpufleet node join-token --node {node}",
            status=401,
        ) from exc
    finally:
        client.close()
    _write(key_file, key_pem(key), 0o600)
    _write(crt, str(got["certificate"]).encode(), 0o644)
    return str(crt), str(key_file)
