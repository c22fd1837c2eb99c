"""The control plane's own records: the leader's lease and terms, the servers'
heartbeats, the audit log of API requests, and server-wide settings."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Float,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class LeaderLease(Base):
    """Who leads the servers of one PostgreSQL (``store/leader.py``): one row, ``name`` "leader"."""

    __tablename__ = "leader_lease"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(160))
    epoch: Mapped[int] = mapped_column(BigInteger)
    """The fencing token: raised by every change of holder."""
    expires_at: Mapped[float] = mapped_column(Float)
    """The database's clock (seconds since the epoch)."""
    renewed_at: Mapped[float] = mapped_column(Float)


class LeaderTerm(Base):
    __tablename__ = "leader_terms"
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    holder: Mapped[str] = mapped_column(String(160))
    acquired_at: Mapped[float] = mapped_column(Float)


class ServerRow(Base):
    """A server process's heartbeat (``gpufleet status``)."""

    __tablename__ = "servers"
    id: Mapped[str] = mapped_column(String(160), primary_key=True)
    url: Mapped[str] = mapped_column(String(512), default="", server_default="")
    version: Mapped[str] = mapped_column(String(64), default="", server_default="")
    started_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class AuditRow(Base):
    """One mutating API request: who, from where, what, and how it ended. Append-only:
    rows are never updated (a trigger refuses it); the retention loop deletes rows older
    than ``--audit-days`` (``server/http/audit.py``)."""

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_at", "at"), Index("ix_audit_actor_id", "actor", "id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(140), nullable=True)
    """A user's name, ``node:NAME`` for a node credential, None when not authenticated."""
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    address: Mapped[str] = mapped_column(String(64))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    object: Mapped[str | None] = mapped_column(String(256), nullable=True)
    status: Mapped[int] = mapped_column(Integer)


class Setting(Base):
    """Server-wide facts kept with the data, e.g. the token key's fingerprint."""

    __tablename__ = "settings"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))
