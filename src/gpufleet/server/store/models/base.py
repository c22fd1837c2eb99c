"""The declarative base every model derives from: its ``metadata`` is the schema that
Alembic compares with the migrations (``server/migrations/env.py``)."""

from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    pass
