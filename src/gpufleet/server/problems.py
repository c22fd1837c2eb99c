"""RFC 9457 problem details for every error the API returns.

Services return expected failures as values (``Failure``); routers turn them into a
``ProblemError`` with ``unwrap``; the handlers here render that, FastAPI's validation
errors, Starlette's 404/405 and anything else as ``application/problem+json``.
An unexpected exception is a 500 whose detail says nothing internal.

FastAPI and Starlette are imported only when an HTTP part here is used (issue 35): the
scheduling child and the services import ``Failure`` from here and never serve HTTP, and
FastAPI costs a process some 25 MB. The path and query parameter types (``ObjectId``, ...)
are built on first access (the module's ``__getattr__``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from gpufleet.api.base import ID_RANGE, INT32
from gpufleet.server.errors import (
    ProblemError as ProblemError,  # (for routers/jobs.py, deps.py until they import errors)
)

if TYPE_CHECKING:
    from fastapi import FastAPI, Query, Request
    from fastapi import Path as PathParam
    from starlette.responses import JSONResponse, Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("gpufleet.server")
PROBLEM_JSON = "application/problem+json"
T = TypeVar("T")


class Kind(enum.Enum):
    """Kinds of expected failure a service may return."""

    INVALID = 422
    UNAUTHORIZED = 401
    FORBIDDEN = 403
    NOT_FOUND = 404
    CONFLICT = 409


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    kind: Kind
    detail: str


def invalid(detail: str) -> Failure:
    return Failure(kind=Kind.INVALID, detail=detail)


def unauthorized(detail: str) -> Failure:
    """A credential that is no longer good (expired, spent): 401."""
    return Failure(kind=Kind.UNAUTHORIZED, detail=detail)


def forbidden(detail: str) -> Failure:
    return Failure(kind=Kind.FORBIDDEN, detail=detail)


def not_found(detail: str) -> Failure:
    return Failure(kind=Kind.NOT_FOUND, detail=detail)


def conflict(detail: str) -> Failure:
    return Failure(kind=Kind.CONFLICT, detail=detail)


def unwrap(result: T | Failure) -> T:
    """A service result, or the problem that its Failure means."""
    if isinstance(result, Failure):
        raise ProblemError(result.kind.value, result.detail)
    return result


def problem_response(
    request: Request | None,
    status: int,
    detail: str,
    *,
    title: str | None = None,
    errors: list[Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    from fastapi.encoders import jsonable_encoder
    from starlette.responses import JSONResponse

    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": request.url.path if request is not None else None,
    }
    if errors is not None:
        body["errors"] = jsonable_encoder(errors)
    return JSONResponse(
        body, status_code=status, media_type=PROBLEM_JSON, headers=dict(headers) if headers else None
    )


def _cut(part: Any) -> Any:
    """A location part as an answer may repeat it: a key the client sent, cut to 64
    characters, with control and format characters (a right-to-left override) escaped
    so the answer cannot reorder what a terminal shows."""
    if not isinstance(part, str):
        return part
    part = part[:64] + "..." if len(part) > 64 else part
    return "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in part)


def _where(loc: Any) -> str:
    parts = [str(p) for p in loc if p != "body"] if isinstance(loc, list | tuple) else []
    return ".".join(parts) or "body"


def _exception_handler(
    request: Request, exc: Exception
) -> Callable[[Request, Exception], Awaitable[Response]] | None:
    """The app's handler for ``exc``'s class or nearest base; none for a bare
    ``Exception`` (that one answers outside all middleware, and re-raises for the log)."""
    handlers = request.app.exception_handlers
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            handler: Callable[[Request, Exception], Awaitable[Response]] = handlers[cls]
            return handler
    return None


async def answered(request: Request, make: Callable[[], Awaitable[Response]]) -> Response:
    """``make()``'s response, or the one the app's handler gives for what it raised (as
    Starlette's exception middleware would): for a route served outside the router
    (``SubmitRoute``, ``AgentShortcut``). An exception no handler takes goes on up, to
    the server error handler (500), outside, as from any route."""
    try:
        return await make()
    except Exception as exc:
        handler = _exception_handler(request, exc)
        if handler is None:
            raise
        return await handler(request, exc)


def install_handlers(app: FastAPI) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(request, exc.status, exc.detail, title=exc.title, errors=exc.errors)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [  # a location may be a key the client sent (100,000 characters): cut
            {"loc": [_cut(p) for p in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in errors):
            return problem_response(request, 400, "request body is not valid JSON", errors=errors)
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        detail = f"{_where(first['loc'])}: {first['msg']}{more}"
        return problem_response(request, 422, detail, title="Invalid request", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such resource: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
        return problem_response(request, exc.status_code, detail, headers=exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        """The client went before its body had all come: its fault, nothing was done, and
        no traceback (nobody reads this answer; the audit log gets a 400, not a 500)."""
        return problem_response(request, 400, "the request body was cut short: the client went first")

    @app.exception_handler(RecursionError)
    async def _deep(request: Request, exc: RecursionError) -> JSONResponse:
        return problem_response(request, 400, "the JSON body is nested too deeply")

    @app.exception_handler(OverflowError)
    async def _overflow(request: Request, exc: OverflowError) -> JSONResponse:
        """A number no column or clock can hold that got past validation (the schemas
        bound the ones they know): the input's fault, and nothing was written."""
        return problem_response(request, 422, f"a number in the request is out of range: {exc}")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(request, 500, "internal server error (logged on the server)")


class BodyLimitMiddleware:
    """Rejects request bodies above ``max_bytes`` with 413, by Content-Length when given
    and by counting the streamed bytes otherwise."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._reject(scope, receive, send)
                return
        seen = 0

        async def counting() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        try:
            await self.app(scope, counting, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        await body_too_large(self.max_bytes, scope.get("path"))(scope, receive, send)


def body_too_large(max_bytes: int, path: str | None = None) -> JSONResponse:
    """The 413 of a body above the server's limit (here and in ``lanes.Admission``)."""
    from starlette.responses import JSONResponse

    body = {"type": "about:blank", "title": "Content Too Large", "status": 413}
    body |= {"detail": f"request body larger than {max_bytes} bytes", "instance": path}
    return JSONResponse(body, status_code=413, media_type=PROBLEM_JSON)


class _TooLarge(Exception):
    pass


class UrlGuardMiddleware:
    """Answers 400 for a request whose path or query string holds a NUL character
    (``%00``): no route takes one, and a NUL that reached a database look-up would be an
    error there (PostgreSQL's text cannot hold U+0000) instead of an answer. Body fields
    are the schemas' (``schemas.Request``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _has_nul(scope):
            from starlette.responses import JSONResponse

            body = {"type": "about:blank", "title": "Bad Request", "status": 400}
            body |= {"detail": "the URL holds a NUL character (%00)", "instance": None}
            await JSONResponse(body, status_code=400, media_type=PROBLEM_JSON)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _has_nul(scope: Scope) -> bool:
    query: bytes = scope.get("query_string", b"")
    raw: bytes = scope.get("raw_path") or b""
    return (
        "\x00" in scope.get("path", "")
        or b"\x00" in raw
        or b"%00" in raw
        or b"\x00" in query
        or b"%00" in query
    )


if TYPE_CHECKING:
    ObjectId = Annotated[int, PathParam(ge=1, le=INT32, description=f"an object id ({ID_RANGE})")]
    """The id in a path (``/jobs/{job_id}``): validated before any SQL sees it, so an id no
    id column can hold (``api.base.Id``: PostgreSQL's ``integer``) is a 422, not a driver
    error."""
    IdQuery = Annotated[int | None, Query(ge=1, le=INT32, description=f"an object id ({ID_RANGE})")]
    """An id in a query string (``?array=``), when given."""
    Offset = Annotated[int, Query(ge=0, le=INT32)]
    StepNumber = Annotated[int, PathParam(ge=0, le=INT32, description="a step of its job (0, 1, ...)")]
    """A count of rows to skip, or an id to start after (``?after=``, ``?cursor=``): every
    id column is PostgreSQL's ``integer``, and no table holds more rows than that."""


def _params() -> dict[str, Any]:
    from fastapi import Path as PathParam
    from fastapi import Query

    return {
        "ObjectId": Annotated[int, PathParam(ge=1, le=INT32, description=f"an object id ({ID_RANGE})")],
        "IdQuery": Annotated[int | None, Query(ge=1, le=INT32, description=f"an object id ({ID_RANGE})")],
        "Offset": Annotated[int, Query(ge=0, le=INT32)],
        "StepNumber": Annotated[int, PathParam(ge=0, le=INT32, description="a step of its job (0, 1, ...)")],
    }


def __getattr__(name: str) -> Any:
    """The parameter types, built (and FastAPI imported) when a router first asks."""
    if name in ("ObjectId", "IdQuery", "Offset", "StepNumber"):
        globals().update(_params())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
