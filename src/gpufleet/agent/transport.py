"""The agent's HTTP seam: one call, ``sync(node, body) -> reply``.

``HttpTransport`` speaks to a gpufleet server with httpx (keep-alive, a node credential
or an operator token); ``AgentTransportError`` carries the HTTP status when there was
one, so the agent can tell "retry later" from "my credential is refused". Tests pass an
``httpx.MockTransport`` or any object with the same ``sync`` method.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import httpx


class AgentTransportError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SyncTransport(Protocol):
    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


class HttpTransport:
    """``token``: a node credential or operator token (plain HTTP, or TLS without client
    certificates); ``cert``: the node's certificate and key files (mTLS, ``enroll.py``),
    sent instead of any token. ``ca_file``: the cluster CA the server's certificate must
    chain to (default: the system's trust store)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        ca_file: str | None = None,
        cert: tuple[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        verify: ssl.SSLContext | bool = True
        if ca_file or cert:
            verify = ssl.create_default_context(cafile=ca_file)
            if cert:
                verify.load_cert_chain(*cert)
        self._http = httpx.Client(
            base_url=self.url + "/v1",
            headers={"Authorization": f"Bearer {token}"} if token and not cert else {},
            timeout=timeout,
            transport=transport,
            verify=verify,
        )

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(f"/nodes/{node}/sync", body)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise AgentTransportError(f"cannot reach {self.url}: {exc.__class__.__name__}: {exc}") from exc
        if resp.status_code >= 400:
            detail = ""
            try:
                detail = str(resp.json().get("detail", ""))
            except ValueError:
                detail = resp.text[:200]
            raise AgentTransportError(
                f"{path} refused ({resp.status_code}): {detail}", status=resp.status_code
            )
        try:
            out: dict[str, Any] = resp.json()
        except ValueError as exc:
            raise AgentTransportError(f"{self.url} sent a non-JSON answer") from exc
        return out

    def close(self) -> None:
        self._http.close()
