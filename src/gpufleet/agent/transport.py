"""The agent's HTTP seam: ``sync(node, body) -> reply``, and (optionally, a
``WaitTransport``) ``wait(node, seen, timeout_s) -> version``, the long-poll that tells
the agent to sync now (``server/store/dispatch.py``), and (a ``RenewTransport``)
``renew(node, lease) -> bool``, an idle node's lease renewal (``renewal.py``).

``HttpTransport`` speaks to a gpufleet server with httpx (keep-alive, a node credential
or an operator token); ``AgentTransportError`` carries the HTTP status when there was
one, so the agent can tell "retry later" from "my credential is refused". Tests pass an
``httpx.MockTransport`` or any object with the same ``sync`` method.

Several servers (one cluster's, ``--server http://a:8080,http://b:8080``): each request
goes to the server that answered last and moves on as ``failover.py`` says. A sync is
idempotent by design (``server/services/sync.py``: replaying one, or losing its answer,
leaves the same state and gets the same answer), so it is sent again to the next server
even after a reset or a timeout, and so is the long-poll (a GET). A long-poll cut by
its server's death therefore resumes on the next server at once, which answers at once
(its version is from another boot) and the agent syncs there without waiting for its
interval. Other posts (a certificate request) move on only when they never reached a
server. One log line per switch of server.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import httpx

from gpufleet.agent.lean import lean_transport
from gpufleet.failover import CONNECT_TIMEOUT_S, NoAnswer, Servers, Switch, first_answer, parse_urls

log = logging.getLogger("gpufleet.agent")

KEEPALIVE_S = 15.0
"""How long the agent keeps an idle connection to the server for its next sync or renewal
(10 s apart by default): under ``gpufleet server --keep-alive`` (20 s), so the server never
closes one as the agent sends on it."""
SYNC_READ_S = 10.0
"""With several servers, a sync that got no answer in this long goes to the next one (a
stopped server would otherwise hold the node for the whole read timeout, 30 s)."""


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


@runtime_checkable
class RenewTransport(Protocol):
    def renew(self, node: str, lease: str) -> bool:
        """Renew an idle node's lease (``renewal.py``): True if the server took it, False
        if the node must sync in full now. Raises ``AgentTransportError``."""
        ...


class HttpTransport:
    """``url``: the server, or several of one cluster (a sequence, or comma-separated).
    ``token``: a node credential or operator token (plain HTTP, or TLS without client
    certificates); ``cert``: the node's certificate and key files (mTLS, ``enroll.py``),
    sent instead of any token: the cluster CA's, good for every server. ``ca_file``: the
    cluster CA the servers' certificates must chain to (default: the system's trust store)."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        ca_file: str | None = None,
        cert: tuple[str, str] | None = None,
    ) -> None:
        try:
            self.servers = Servers(parse_urls(url))
        except ValueError as exc:
            raise AgentTransportError(f"server URL: {exc}") from exc
        self.ca_file = ca_file or ""
        """For jobs' ``GPUFLEET_CA_FILE`` (their Slurm commands trust what the agent trusts)."""
        verify: ssl.SSLContext | bool = True
        if ca_file or cert:
            verify = ssl.create_default_context(cafile=ca_file)
            if cert:
                verify.load_cert_chain(*cert)
        self._given = transport
        self._verify = verify
        self._options: dict[str, Any] = {
            "headers": {"Authorization": f"Bearer {token}"} if token and not cert else {},
            "verify": verify,
        }
        # one kept connection for syncs and renewals (10 s apart): below the server's 20 s
        # keep-alive (``gpufleet server --keep-alive``), above httpx's 5 s default
        self._http = httpx.Client(
            timeout=self._timeout(timeout),
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
            transport=self._transport(),
            **self._options,
        )
        self._poll: httpx.Client | None = None  # the long-poll's own connection, made on first use

    def _transport(self) -> httpx.BaseTransport | None:
        """A client's transport: the one given (tests), else ``lean.py``'s where it applies
        (every server of a cluster is reached the same way: the first URL decides)."""
        return lean_transport(self.servers.urls[0], self._verify, KEEPALIVE_S, self._given)

    @property
    def url(self) -> str:
        """The server that answered last (before any did, the first given)."""
        return self.servers.current

    def _timeout(self, seconds: float) -> httpx.Timeout:
        several = len(self.servers.urls) > 1
        return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT_S) if several else seconds)

    def _send(self, send: Callable[[str], httpx.Response], *, repeatable: bool) -> httpx.Response:
        """``send(server URL)``'s first answer from the servers in turn."""
        try:
            resp, switch = first_answer(self.servers, send, repeatable=repeatable)
        except NoAnswer as exc:
            raise AgentTransportError(str(exc), status=exc.status) from exc.__cause__
        _log_switch(switch)
        return resp

    def wait(self, node: str, seen: str | None, timeout_s: float) -> str:
        limit = self._timeout(timeout_s + 10.0)
        if self._poll is None:
            self._poll = httpx.Client(timeout=limit, transport=self._transport(), **self._options)
        poll = self._poll
        params: dict[str, str | float] = {"timeout": timeout_s}
        if seen is not None:
            params["seen"] = seen

        def get(url: str) -> httpx.Response:
            return poll.get(f"{url}/v1/nodes/{node}/wait", params=params, timeout=limit)

        resp = self._send(get, repeatable=True)
        if resp.status_code >= 400:
            raise AgentTransportError(f"long-poll refused ({resp.status_code})", status=resp.status_code)
        try:
            return str(resp.json()["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentTransportError(f"{self.url} sent a bad long-poll answer") from exc

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        # idempotent by design (server/services/sync.py): safe to send again to another
        # server, so with several a stopped one costs SYNC_READ_S, not the full read timeout
        several = len(self.servers.urls) > 1
        limit = self._timeout(SYNC_READ_S) if several else None
        return self.post(f"/nodes/{node}/sync", body, repeatable=True, timeout=limit)

    def renew(self, node: str, lease: str) -> bool:
        several = len(self.servers.urls) > 1  # idempotent, as a sync
        limit = self._timeout(SYNC_READ_S) if several else None
        out = self.post(f"/nodes/{node}/renew", {"lease": lease}, repeatable=True, timeout=limit)
        return out.get("renewed") is True

    def post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        repeatable: bool = False,
        timeout: httpx.Timeout | None = None,
    ) -> dict[str, Any]:
        """``POST /v1{path}``; ``repeatable``: it may be sent again to another server
        after it may have reached one (only what is idempotent)."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        resp = self._send(
            lambda url: self._http.post(f"{url}/v1{path}", json=body, **extra), repeatable=repeatable
        )
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


def _log_switch(switch: Switch | None) -> None:
    if switch is not None:
        log.warning("server %s failed (%s): now using %s", switch.old, switch.why, switch.new)
