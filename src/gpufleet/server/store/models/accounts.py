"""Who may call, and for whom: users, teams (their quotas and budgets), memberships and API tokens."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)


class Team(Base):
    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    quota_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quota_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    budget_soft: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Monthly spend at which the team is warned (None: no warning)."""
    budget_hard: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Monthly spend at which its pending jobs are held (None: never held)."""


class Membership(Base):
    __tablename__ = "memberships"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The user's default team (Slurm's DefaultAccount): at most one per user."""


class Token(Base):
    """An API token; ``token_hash`` is HMAC-SHA256 with the server's key (``store/tokenkey.py``;
    plain sha256 in rows older than 0008 until their first use)."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """None: never (only the bootstrap admin token; ``services/tokens.py``)."""
    kind: Mapped[str] = mapped_column(String(16), default="api", server_default="api")
    """``api``, ``session`` (the fleet page's sign-in) or ``bootstrap`` (the first admin's)."""
