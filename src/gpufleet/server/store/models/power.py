"""Rack power budgets (issue 34, ``services/racks.py``): what an operator declares of each
rack's feed, and the power figures that override the core's table (``scheduler/powermodel.py``)."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class RackPowerRow(Base):
    """A rack's power feed: new work starts in it only while its estimated draw stays
    within ``budget_w x (1 - headroom)``. A rack without a row has no budget."""

    __tablename__ = "rack_power"
    __table_args__ = (
        CheckConstraint("budget_w > 0", name="ck_rack_power_budget"),
        CheckConstraint("headroom >= 0 AND headroom < 1", name="ck_rack_power_headroom"),
    )
    rack: Mapped[str] = mapped_column(String(64), primary_key=True)
    budget_w: Mapped[float] = mapped_column(Float)
    headroom: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(64))


class PowerFigureRow(Base):
    """An operator's figure for a GPU model (``kind`` "model": its board power) or a node
    (``kind`` "node": its GPUs' board power and/or its base draw), over the defaults."""

    __tablename__ = "power_figures"
    __table_args__ = (
        CheckConstraint("kind IN ('model', 'node')", name="ck_power_figures_kind"),
        CheckConstraint("board_w IS NULL OR board_w > 0", name="ck_power_figures_board"),
        CheckConstraint("base_w IS NULL OR base_w >= 0", name="ck_power_figures_base"),
    )
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    board_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    base_w: Mapped[float | None] = mapped_column(Float, nullable=True)
