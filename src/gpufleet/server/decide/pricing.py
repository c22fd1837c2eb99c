"""Elastic GPU prices: a pure price schedule (no database, no clock).

A schedule is a base price per GPU-hour per GPU model, times the multipliers in force:
time-of-day windows (``22:00-08:00 x0.5``, wrapping midnight), per-weekday multipliers
(``weekend`` = Saturday and Sunday) evaluated in the schedule's time zone, and a priority
multiplier ``1 + priority_step * priority`` (never below 0). Multipliers that apply at
once multiply.

Cost over an interval splits it at every instant where the price may change (each
window's edges and each local midnight, so daylight-saving days are exact) and sums
GPUs x hours x price of each piece.

File format (JSON, or the same keys in TOML)::

    {"timezone": "Europe/Berlin", "base": {"H100": 2.5, "*": 1.0},
     "windows": [{"start": "22:00", "end": "08:00", "multiplier": 0.5}],
     "weekend": 0.6, "weekdays": {}, "priority_step": 0.1}
"""

from __future__ import annotations

import itertools
import json
import tomllib
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, field_validator

_DAY_HORIZON = 8  # next_cheaper looks this many days ahead (a full week and a bit)


def _hhmm(text: str) -> time:
    hh, _, mm = text.partition(":")
    return time(int(hh) % 24, int(mm or 0))


class PriceWindow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    start: str = Field(pattern=r"^([01]?\d|2[0-4]):[0-5]\d$")
    end: str = Field(pattern=r"^([01]?\d|2[0-4]):[0-5]\d$")
    multiplier: float = Field(ge=0)

    def covers(self, t: time) -> bool:
        a, b = _hhmm(self.start), _hhmm(self.end)
        return a <= t < b if a <= b else (t >= a or t < b)


class PriceSchedule(BaseModel):
    """Validated on load; ``base["*"]`` prices models not listed (absent: free)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    timezone: str = "UTC"
    base: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    windows: tuple[PriceWindow, ...] = ()
    weekend: float = Field(default=1.0, ge=0)
    weekdays: dict[int, float] = Field(default_factory=dict, description="0=Monday .. 6=Sunday")
    priority_step: float = 0.0
    warm: float = Field(default=0.5, ge=0, le=1)
    """The price factor of a warm (standby) replica of an inference service: started and
    ready but out of rotation, it holds its GPUs at this share of the price."""

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        ZoneInfo(v)  # raises for an unknown zone
        return v

    # -- prices ---------------------------------------------------------------------------
    def base_price(self, model: str) -> float:
        return self.base.get(model, self.base.get("*", 0.0))

    def multiplier(self, ts: float, *, priority: int = 0) -> float:
        local = datetime.fromtimestamp(ts, ZoneInfo(self.timezone))
        m = max(0.0, 1.0 + self.priority_step * priority)
        for w in self.windows:
            if w.covers(local.time()):
                m *= w.multiplier
        wd = local.weekday()
        if wd >= 5:
            m *= self.weekend
        return m * self.weekdays.get(wd, 1.0)

    def price(self, model: str, ts: float, *, priority: int = 0) -> float:
        """Per GPU-hour at ``ts``."""
        return self.base_price(model) * self.multiplier(ts, priority=priority)

    def boundaries(self, start: float, end: float) -> list[float]:
        """Instants in ``(start, end)`` where the price may change, sorted."""
        zone = ZoneInfo(self.timezone)
        first: date = datetime.fromtimestamp(start, zone).date()
        last: date = datetime.fromtimestamp(end, zone).date()
        edges = {time(0, 0)} | {_hhmm(w.start) for w in self.windows} | {_hhmm(w.end) for w in self.windows}
        out: set[float] = set()
        day = first
        while day <= last:
            for t in edges:
                ts = datetime.combine(day, t, zone).timestamp()
                if start < ts < end:
                    out.add(ts)
            day += timedelta(days=1)
        return sorted(out)

    def cost(self, model: str, start: float, end: float, *, gpus: int, priority: int = 0) -> float:
        """GPUs x hours x the price in force, over ``[start, end)``."""
        if end <= start or gpus <= 0:
            return 0.0
        cuts = [start, *self.boundaries(start, end), end]
        return sum(
            gpus * (b - a) / 3600.0 * self.price(model, a, priority=priority)
            for a, b in itertools.pairwise(cuts)
        )

    def next_cheaper(self, model: str, now: float) -> tuple[float, float] | None:
        """(when, price) of the first change within a week to a price below now's."""
        current = self.price(model, now)
        for ts in self.boundaries(now, now + _DAY_HORIZON * 86400):
            p = self.price(model, ts)
            if p < current:
                return ts, p
        return None


def parse_prices(data: Mapping[str, Any]) -> PriceSchedule:
    """Raises pydantic.ValidationError (or ZoneInfoNotFoundError) for a bad schedule."""
    return PriceSchedule.model_validate(dict(data))


def load_prices(path: Path) -> PriceSchedule:
    """A JSON or (by suffix ``.toml``) TOML price file. Raises OSError or ValueError."""
    text = path.read_text()
    data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    return parse_prices(data)
