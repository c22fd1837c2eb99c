"""Inference services: the service, the specs of its generations, the models it wants
loaded, its gateway tokens and its events (its replicas are jobs: ``jobs.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class ServiceRow(Base):
    """A long-running inference service: its spec (``api.services.ServiceSpec`` as JSON)
    and the generation of that spec (each update makes a new one; replicas of an older
    generation are replaced one by one). ``state``: ``active`` or ``deleting`` (its
    replicas are being stopped; the row goes once none is left)."""

    __tablename__ = "services"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    scaled_replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The autoscaler's current count (None: not autoscaled, ``spec.replicas`` holds)."""
    state: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer, default=0)


class ServiceSpecRow(Base):
    """A service's spec as it was when one of its generations began (``gpufleet service
    rollback`` deploys an earlier generation's replica template again, as ``kubectl
    rollout undo``)."""

    __tablename__ = "service_specs"
    __table_args__ = (UniqueConstraint("service_id", "generation", name="uq_service_specs_generation"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    generation: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))


class ServiceModelRow(Base):
    """A model a service wants loaded or unloaded on every replica (``gpufleet service
    model load|unload``, issue 30): ``wanted`` is ``loaded`` or ``unloaded``; the agents
    converge their replicas to it (``agent/replicamodels.py``)."""

    __tablename__ = "service_models"
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    wanted: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))


class ServiceToken(Base):
    """A token callers present at the gateway (``gpufleet service token NAME``); only
    its sha256 is kept (256 random bits: a plain hash is enough, and the gateway can
    check it without the server's key)."""

    __tablename__ = "service_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ServiceEvent(Base):
    """What happened to a service (deployed, updated, replica started/replaced, drained)."""

    __tablename__ = "service_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))
    kind: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(512), default="")
