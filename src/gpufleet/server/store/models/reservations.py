"""Reservations: GPUs booked on named nodes for a window, and what happened to them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class ReservationRow(Base):
    """GPUs booked on named nodes for ``[start, end)`` (UNIX seconds, UTC).

    ``node_map`` holds [node, GPU count] pairs chosen at admission (and changed by the
    scheduler's reservation moves). ``state``: BOOKED, CANCELLED (by a person) or
    RELEASED (reclaimed unused); a BOOKED row past ``end`` is simply over.
    """

    __tablename__ = "reservations"
    __table_args__ = (Index("ix_reservations_state_end", "state", "end"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    users: Mapped[list[str]] = mapped_column(JSON)
    pool: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float)
    node_map: Mapped[list[list[Any]]] = mapped_column(JSON)
    maintenance: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(512), default="")
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Last scheduling pass that saw an owner job on its GPUs inside the window."""


class ReservationEvent(Base):
    """What happened to a reservation (booked, moved, cancelled, released), and who did it."""

    __tablename__ = "reservation_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reservation_id: Mapped[int] = mapped_column(ForeignKey("reservations.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(512), default="")
