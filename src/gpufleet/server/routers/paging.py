"""The two query parameters of every paged list (``pages.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from gpufleet.server.store.pages import MAX_LIMIT

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="items per page")]
Cursor = Annotated[
    str | None, Query(min_length=1, max_length=256, description="the previous page's next_cursor")
]
