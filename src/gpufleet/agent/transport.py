"""The agent's HTTP seam: ``sync(node, body) -> reply``, and (optionally, a
``WaitTransport``) ``wait(node, seen, timeout_s) -> version``, the long-poll that tells
the agent to sync now (``server/dispatch.py``).

``HttpTransport`` speaks to a gpufleet server with httpx (keep-alive, a node credential
or an operator token); ``AgentTransportError`` carries the HTTP status when there was
one, so the agent can tell "retry later" from "my credential is refused". Tests pass an
``httpx.MockTransport`` or any object with the same ``sync`` method.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol, runtime_checkable

import httpx


class AgentTransportError(Exception):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SyncTransport(Protocol):
    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class WaitTransport(Protocol):
    def wait(self, node: str, seen: str | None, timeout_s: float) -> str:
        """The node's dispatch version once it differs from ``seen``, or after
        ``timeout_s`` (the same). Raises ``AgentTransportError``."""
        ...


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
        options: dict[str, Any] = {
            "base_url": self.url + "/v1",
            "headers": {"Authorization": f"Bearer {token}"} if token and not cert else {},
            "transport": transport,
            "verify": verify,
        }
        self._http = httpx.Client(timeout=timeout, **options)
        self._options = options
        self._poll: httpx.Client | None = None  # the long-poll's own connection, made on first use

    def wait(self, node: str, seen: str | None, timeout_s: float) -> str:
        if self._poll is None:
            self._poll = httpx.Client(timeout=timeout_s + 10.0, **self._options)
        params: dict[str, str | float] = {"timeout": timeout_s}
        if seen is not None:
            params["seen"] = seen
        try:
            resp = self._poll.get(f"/nodes/{node}/wait", params=params, timeout=timeout_s + 10.0)
        except httpx.HTTPError as exc:
            raise AgentTransportError(f"cannot reach {self.url}: {exc.__class__.__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise AgentTransportError(f"long-poll refused ({resp.status_code})", status=resp.status_code)
        try:
            return str(resp.json()["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentTransportError(f"{self.url} sent a bad long-poll answer") from exc

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
        if self._poll is not None:
            self._poll.close()
