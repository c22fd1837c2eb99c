"""Pages of the list endpoints: ``{"items": [...], "next_cursor": ...}``, as
``GET /v1/jobs`` answers (``JobPage``), for users, teams, tokens, nodes, pools and
reservations.

Paging is by key (the last item's sort key is the cursor, "keyset" paging), so a page
is stable while rows are added and costs the same however deep it is. The cursor is
opaque to clients: pass the previous page's ``next_cursor`` as ``?cursor=``; null means
the last page (``routers/paging.py`` declares the two parameters). ``limit`` is 1..1000,
100 by default (a list page's cost in the rate limits grows with it: ``ratelimit.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import Field

from gpufleet.api.base import INT32, Reply
from gpufleet.api.nodes import NodeOut
from gpufleet.api.reservations import ReservationOut
from gpufleet.api.users import PoolOut, TeamOut, TokenOut, UserOut

T = TypeVar("T")
NEXT = "pass as ?cursor= for the next page; null at the end"
MAX_LIMIT = 1000


class UserPage(Reply):
    items: list[UserOut]
    next_cursor: str | None = Field(description=NEXT)


class TeamPage(Reply):
    items: list[TeamOut]
    next_cursor: str | None = Field(description=NEXT)


class TokenPage(Reply):
    items: list[TokenOut]
    next_cursor: str | None = Field(description=NEXT)


class NodePage(Reply):
    items: list[NodeOut]
    next_cursor: str | None = Field(description=NEXT)


class PoolPage(Reply):
    items: list[PoolOut]
    next_cursor: str | None = Field(description=NEXT)


class ReservationPage(Reply):
    items: list[ReservationOut]
    next_cursor: str | None = Field(description=NEXT)


def cut(rows: list[T], limit: int, key: Callable[[T], str]) -> tuple[list[T], str | None]:
    """The first ``limit`` of ``rows`` (fetched with ``limit + 1``: one more says
    whether there is a next page) and the cursor after them."""
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (key(rows[-1]) if more and rows else None)


def id_cursor(cursor: str | None) -> int | None:
    """An id cursor (``123``, at most 2^31-1: an id a row can have, ``api.base.Id``);
    ValueError for anything else."""
    if cursor is None:
        return None
    value = int(cursor)
    if not 0 <= value <= INT32:
        raise ValueError(cursor)
    return value
