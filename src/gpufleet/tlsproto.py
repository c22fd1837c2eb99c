"""The client certificate in the ASGI scope (the ASGI TLS extension).

uvicorn verifies a client certificate against ``ssl_ca_certs`` during the handshake but
does not hand it to the application. This protocol class does: on each request the
scope carries ``extensions["tls"]`` as the ASGI spec describes it
(``client_cert_chain``: the peer's certificate in PEM, ``tls_version``,
``cipher_suite``...), read once per connection. ``gpufleet server --tls-cert --ca-dir``
runs uvicorn with it (``http=TlsHttpToolsProtocol``).

Both TLS protocols write a response in one TLS record (``CoalescingHttpToolsProtocol``):
uvicorn writes the head and the body separately, and over TLS every write is a record of
its own, encrypted and sent on its own. Gathering the writes of one event-loop turn took
the HTTPS submit rate from 74-77 % to 82 % of plain HTTP (``bench/bench_api.py --tls``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def tls_extension(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    obj = transport.get_extra_info("ssl_object")
    if not isinstance(obj, ssl.SSLObject | ssl.SSLSocket):
        return None
    der = obj.getpeercert(binary_form=True)
    cipher = obj.cipher()
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": None,
        "client_cert_error": None,
        "tls_version": obj.version(),
        "cipher_suite": cipher[0] if cipher else None,
    }


class _Coalescing:
    """A transport that gathers the writes of one event-loop turn into one: uvicorn
    writes a response's head and body separately, and over TLS each write is a record
    of its own (an encryption and a send each)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        self._loop = loop
        self._buf: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        if self._buf:
            data = b"".join(self._buf)
            self._buf.clear()
            if not self._t.is_closing():
                self._t.write(data)

    def close(self) -> None:
        self._flush()
        self._t.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol writing through ``_Coalescing`` (``gpufleet server --tls-cert``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Coalescing(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]


class TlsHttpToolsProtocol(CoalescingHttpToolsProtocol):
    _tls: dict[str, Any] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._tls = tls_extension(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls is not None:
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]
            scope["extensions"] = {**scope.get("extensions", {}), "tls": self._tls}


def peer_certificate(scope: Mapping[str, Any]) -> str | None:
    """The client certificate (PEM) a request came with, if any."""
    chain = scope.get("extensions", {}).get("tls", {}).get("client_cert_chain") or []
    return str(chain[0]) if chain else None
