"""The cost ledger: what each job used per UTC hour, and the price schedules."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class UsageRow(Base):
    """What one job used in one UTC hour: the ledger ``gpufleet usage`` sums.

    Written as cost accrues (every accrual tick and when the job lets its GPUs go),
    so a report over any whole hours is a sum, never a recomputation. ``observed_gpu_s``
    is the part of ``gpu_s`` with fresh telemetry; utilisation and idle waste are over it.
    """

    __tablename__ = "usage"
    __table_args__ = (
        UniqueConstraint("job_id", "hour", name="uq_usage_job_hour"),
        Index("ix_usage_hour", "hour"),
        Index("ix_usage_team_hour", "team_id", "hour"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer)
    hour: Mapped[float] = mapped_column(Float)
    user_id: Mapped[int] = mapped_column(Integer)
    team_id: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str] = mapped_column(String(64))
    gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    energy_wh: Mapped[float] = mapped_column(Float, default=0.0)
    observed_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    util_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    """Sum of utilisation (0..1) x GPU-seconds over the observed part."""
    idle_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    """Observed GPU-seconds at under 5% utilisation."""


class PriceScheduleRow(Base):
    """Every price schedule ever set; the newest is in force (``PUT /v1/prices``)."""

    __tablename__ = "price_schedules"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
