"""Bodies of the audit log endpoint (``GET /v1/audit``)."""

from __future__ import annotations

from pydantic import Field

from gpufleet.api.base import Reply


class AuditOut(Reply):
    id: int
    at: float
    actor: str | None = Field(description="user name, node:NAME, or null when not authenticated")
    role: str | None
    token_id: int | None
    address: str = Field(description="the client's address as the server saw it")
    method: str
    path: str
    object: str | None = Field(description="the id or name of what the request acted on, when known")
    status: int = Field(description="the HTTP status it was answered with")


class AuditPage(Reply):
    items: list[AuditOut] = Field(description="newest first")
    next_cursor: str | None = Field(description="pass as ?cursor= for the next (older) page; null at the end")
