"""The gateway's own answers (401, 404, 413, 429, 502, 503, 504) in the shape of the
service's protocol, so each protocol's clients can read them:

============  ==========================================================  ==========================
protocol      body                                                        read by
============  ==========================================================  ==========================
kserve-v2     ``{"error": "<detail>"}`` (``application/json``)            tritonclient (its
                                                                          ``InferenceServerException``
                                                                          carries the detail)
openai        ``{"error": {"message", "type", "param", "code"}}``         the openai client
                                                                          (``e.message``, ``e.code``)
http          RFC 9457 problem details (``application/problem+json``),   anything; as the server
              as the server answers its own errors                        answers
============  ==========================================================  ==========================

Why: tritonclient failed with ``... while decoding the response: 'error'`` on a
problem document, and openai printed a bare ``Error code: 401``. The protocol is the
service's, from the feed; for a name the feed does not list (no service, so no
protocol) it is guessed from the path: ``/v2/...`` is KServe, ``/v1/...`` OpenAI.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PROBLEM = b"application/problem+json"
JSON = b"application/json"

OPENAI_KIND: dict[int, tuple[str, str]] = {
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}
"""OpenAI's error ``type`` and ``code`` for each status the gateway answers itself."""


def guess_protocol(rest: bytes) -> str:
    """The protocol a request for a service the gateway does not know most likely speaks."""
    if rest.startswith(b"/v2/") or rest == b"/v2":
        return "kserve-v2"
    if rest.startswith(b"/v1/"):
        return "openai"
    return "http"


def error_body(protocol: str, status: int, title: str, detail: str) -> tuple[bytes, bytes]:
    """(content type, body) of an error in ``protocol``'s shape."""
    if protocol == "kserve-v2":
        return JSON, json.dumps({"error": detail}).encode()
    if protocol == "openai":
        fallback = ("server_error" if status >= 500 else "invalid_request_error", "")
        kind, code = OPENAI_KIND.get(status, fallback)
        error = {"message": detail, "type": kind, "param": None, "code": code or None}
        return JSON, json.dumps({"error": error}).encode()
    doc = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return PROBLEM, json.dumps(doc).encode()


async def reply(
    send: Send,
    status: int,
    ctype: bytes,
    body: bytes,
    extra: tuple[tuple[bytes, bytes], ...] | list[Any] = (),
) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def error(
    send: Send,
    protocol: str,
    status: int,
    title: str,
    detail: str,
    rid: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """The gateway's own error answer, in ``protocol``'s shape (see the table above)."""
    ctype, body = error_body(protocol, status, title, detail)
    headers = list(extra or ())
    if rid:
        headers.append((b"x-request-id", rid))
    await reply(send, status, ctype, body, headers)


__all__ = ["JSON", "OPENAI_KIND", "PROBLEM", "error", "error_body", "guess_protocol", "reply"]
