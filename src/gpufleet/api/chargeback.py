"""Prices and usage reports."""

from __future__ import annotations

from pydantic import (
    Field,
)

from gpufleet.api.base import Reply


class PriceNow(Reply):
    gpu_type: str
    price: float = Field(description="per GPU-hour now, priority 0")
    base: float
    next_cheaper_at: float | None = Field(description="when the price first drops, within a week")
    next_cheaper_price: float | None
    in_fleet: bool = Field(default=False, description="some registered GPU is of this model")


class PricesOut(Reply):
    schedule: dict[str, object] | None = Field(description="the schedule in force; null: no prices set")
    set_at: float | None
    set_by: str | None
    now: float
    prices: list[PriceNow]


class UsageRowOut(Reply):
    key: str
    jobs: int
    gpu_hours: float
    cost: float
    energy_kwh: float
    avg_util_pct: float | None = Field(description="of allocated GPUs, over the time with telemetry")
    idle_gpu_hours: float = Field(description="allocated GPU-hours observed at under 5% utilisation")


class UsageReport(Reply):
    by: str
    start: float
    end: float
    timezone: str
    rows: list[UsageRowOut]
    total: UsageRowOut
