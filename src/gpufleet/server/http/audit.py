"""The audit log: one row per mutating API request (POST, PUT, PATCH, DELETE) with who
(user, role, token), from where, what (method, path, the object's id when known) and how
it ended (the status), written by ``AuditMiddleware``. Agents' syncs and lease renewals
are not audited (thousands a minute; what they change is in the job event log).

Who: the ``Me`` dependency (``deps.current_principal``, which the submit route calls
too) and the agent
routes note the caller in the request's scope (``note_principal``/``note_actor``); a
request that never authenticated has no actor. The object: what a handler noted
(``note_object``), else the ``id`` (or ``name``) of a 201's body, else the route's path
parameters.

Writing, and why it does not slow a submit (``AuditLog``): rows go through the
group-commit writer as one bulk insert per batch, sharing the commit (and fsync) of
whatever else is in it.

* A request that changed state gets its reply only once its row is committed, so the
  client never sees a success the log does not hold; a crash in between loses the reply,
  not the row of a reply someone saw. This costs such a request one more group commit.
* Two kinds are not held back: refusals (4xx: nothing changed) and submissions
  (``POST /v1/jobs``, the hot path). A submission's job row and its first event row
  already record who submitted and when, in the same transaction as the job, so a
  crash before the audit row's commit (``DELAY_S`` and a batch) loses only the address
  and token id. Their rows are gathered for ``DELAY_S`` and handed to the writer as one
  item, which joins a batch that commits anyway: one executemany (and a few more pages
  in that commit) per ``DELAY_S`` instead of one per batch. The server hands over what
  is gathered before it stops. ``bench/bench_audit.py`` measures the cost (on and off).
* A failed audit write is retried (three times) and then logged as lost.

Retention: ``retention_step`` deletes rows older than ``--audit-days`` in chunks (a
``loops.Loop`` runs it hourly). Rows are never updated: a trigger refuses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.server.services.auth import Principal
from gpufleet.server.store.models import AuditRow
from gpufleet.server.store.writer import Writer

log = logging.getLogger("gpufleet.server")

MUTATING = frozenset(("POST", "PUT", "PATCH", "DELETE"))
NOT_AUDITED = re.compile(r"/v1/nodes/[^/]+/(?:sync|renew)")
SUBMIT = ("POST", "/v1/jobs")
ACTOR_KEY = "gpufleet.actor"
OBJECT_KEY = "gpufleet.object"
RETRIES = 3
DELAY_S = 0.1
MAX_BODY = 65_536
"""Bodies of 201s larger than this are not read for the new object's id."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Actor:
    name: str
    role: str | None = None
    token_id: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    at: float
    actor: str | None
    role: str | None
    token_id: int | None
    address: str
    method: str
    path: str
    object: str | None
    status: int

    def row(self) -> dict[str, Any]:
        """The insert's parameters (``dataclasses.asdict`` deep-copies: 10x the cost)."""
        return {
            "at": self.at,
            "actor": self.actor,
            "role": self.role,
            "token_id": self.token_id,
            "address": self.address,
            "method": self.method,
            "path": self.path,
            "object": self.object,
            "status": self.status,
        }


def note_actor(scope: Scope, actor: Actor) -> None:
    scope[ACTOR_KEY] = actor


def note_principal(scope: Scope, who: Principal) -> None:
    scope[ACTOR_KEY] = Actor(name=who.name, role=who.role, token_id=who.token_id)


def note_object(scope: Scope, obj: object) -> None:
    scope[OBJECT_KEY] = str(obj)


_INSERT = insert(AuditRow.__table__)  # type: ignore[arg-type]


def write_records(s: Session, items: Sequence[Sequence[AuditRecord]]) -> list[None]:
    """A ``BulkOp`` (each item a list of rows): the batch's rows in one executemany
    (Core: the ORM's bulk insert costs several times more per row, on the writer thread
    of the API process)."""
    s.connection().execute(_INSERT, [r.row() for rows in items for r in rows])
    return [None] * len(items)


class AuditLog:
    """Hands rows to the group-commit writer: at once (``write``: the caller waits for
    the commit) or gathered on the event loop for ``delay_s`` (``add``). ``flush`` hands
    over what is gathered (the app's lifespan calls it before the writer closes)."""

    def __init__(self, writer: Writer, *, delay_s: float = DELAY_S) -> None:
        self.writer = writer
        self.delay_s = delay_s
        self.lost = 0
        self._gathered: list[AuditRecord] = []
        self._timer: asyncio.TimerHandle | None = None

    def write(self, record: AuditRecord) -> Future[None]:
        return self._apply([record], RETRIES)

    def add(self, record: AuditRecord) -> None:
        """On the event loop only."""
        self._gathered.append(record)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self._gathered = self._gathered, []
        if rows:
            self._apply(rows, RETRIES)

    def _apply(self, rows: list[AuditRecord], retries: int) -> Future[None]:
        fut = self.writer.apply(write_records, rows)

        def done(f: Future[None]) -> None:
            exc = f.exception()
            if exc is None:
                return
            if retries > 0:
                self._apply(rows, retries - 1)
                return
            self.lost += len(rows)
            log.error("%d audit row(s) lost (first: %s %s): %s", len(rows), rows[0].method, rows[0].path, exc)

        fut.add_done_callback(done)
        return fut


class AuditMiddleware:
    """Pure ASGI. Sits inside admission (a request refused for a rate limit is not
    logged: during a flood that would be a write per refused request) and outside
    the routes (the submit route notes its caller and the new job's id)."""

    def __init__(self, app: ASGIApp, *, audit: AuditLog, now: Callable[[], float]) -> None:
        self.app = app
        self.audit = audit
        self.now = now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING or NOT_AUDITED.fullmatch(scope["path"]):
            await self.app(scope, receive, send)
            return
        at = self.now()
        held: list[Message] = []
        finished = False

        async def hold(message: Message) -> None:
            nonlocal finished
            held.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
                await self._finish(scope, at, held)
                for m in held:
                    await send(m)
                held.clear()

        try:
            await self.app(scope, receive, hold)
        except BaseException as exc:
            if not finished:  # 499: the client went away; 500: the error handler outside answers
                status = 499 if isinstance(exc, asyncio.CancelledError) else 500
                self.audit.add(_record(scope, at, status, None))
            raise

    async def _finish(self, scope: Scope, at: float, held: list[Message]) -> None:
        status = int(next(m["status"] for m in held if m["type"] == "http.response.start"))
        record = _record(scope, at, status, held)
        if 400 <= status < 500 or (scope["method"], scope["path"]) == SUBMIT:
            self.audit.add(record)
            return
        try:
            await asyncio.wrap_future(self.audit.write(record))
        except Exception as exc:  # the state changed: answer anyway; the retries go on
            log.error("audit row of %s %s not yet written: %s", scope["method"], scope["path"], exc)


def _record(scope: Scope, at: float, status: int, held: list[Message] | None) -> AuditRecord:
    actor: Actor | None = scope.get(ACTOR_KEY)
    return AuditRecord(
        at=at,
        actor=actor.name if actor else None,
        role=actor.role if actor else None,
        token_id=actor.token_id if actor else None,
        address=str((scope.get("client") or ("-",))[0])[:64],
        method=str(scope["method"])[:8],
        path=str(scope["path"])[:512],
        object=_object(scope, status, held),
        status=status,
    )


def _object(scope: Scope, status: int, held: list[Message] | None) -> str | None:
    noted = scope.get(OBJECT_KEY)
    if noted is not None:
        return str(noted)[:256]
    if status == 201 and held:
        body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        made = _created(body) if len(body) <= MAX_BODY else None
        if made:
            return made[:256]
    params = scope.get("path_params") or {}
    return ",".join(str(v) for v in params.values())[:256] or None


def _created(body: bytes) -> str | None:
    """The new object's ``id`` (or ``name``) in a 201's JSON; several for a list."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        return None
    items = doc if isinstance(doc, list) else [doc]
    keys = [str(x.get("id", x.get("name", ""))) for x in items if isinstance(x, dict)]
    return ",".join(k for k in keys if k) or None


# -- retention ---------------------------------------------------------------------------------
