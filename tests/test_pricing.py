"""The price schedule: multipliers, cost split at price changes, the next cheaper window."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpufleet.server.decide.pricing import PriceSchedule, load_prices, parse_prices

BERLIN = ZoneInfo("Europe/Berlin")
SPEC = {
    "timezone": "Europe/Berlin",
    "base": {"H100": 2.0, "*": 1.0},
    "windows": [{"start": "22:00", "end": "08:00", "multiplier": 0.5}],
    "weekend": 0.6,
    "priority_step": 0.1,
}


def at(y: int, mo: int, d: int, h: int, mi: int = 0) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=BERLIN).timestamp()


@pytest.fixture
def prices() -> PriceSchedule:
    return parse_prices(SPEC)


@pytest.mark.parametrize(
    ("model", "ts", "priority", "want"),
    [
        ("H100", at(2026, 12, 2, 12), 0, 2.0),  # Wednesday noon
        ("H100", at(2026, 12, 2, 23), 0, 1.0),  # night
        ("H100", at(2026, 12, 3, 7, 59), 0, 1.0),  # night wraps midnight
        ("H100", at(2026, 12, 5, 12), 0, 1.2),  # Saturday
        ("H100", at(2026, 12, 5, 23), 0, 0.6),  # Saturday night: both
        ("A100", at(2026, 12, 2, 12), 0, 1.0),  # the "*" price
        ("H100", at(2026, 12, 2, 12), 5, 3.0),  # priority 5: x1.5
    ],
    ids=["day", "night", "night-wraps", "weekend", "weekend-night", "default-model", "priority"],
)
def test_price(prices: PriceSchedule, model: str, ts: float, priority: int, want: float) -> None:
    assert prices.price(model, ts, priority=priority) == pytest.approx(want)


@pytest.mark.parametrize(
    ("start", "end", "gpus", "want"),
    [
        (at(2026, 12, 2, 21), at(2026, 12, 2, 23), 4, 4 * (1 * 2.0 + 1 * 1.0)),  # across 22:00
        (at(2026, 12, 2, 7), at(2026, 12, 2, 9), 1, 1.0 + 2.0),  # across 08:00
        (at(2026, 12, 4, 23), at(2026, 12, 5, 1), 2, 2 * (1.0 + 0.6)),  # into the weekend
        (at(2026, 3, 29, 0), at(2026, 3, 29, 4), 1, 3 * 0.6),  # DST day: 3 real hours
    ],
    ids=["price-change-22h", "price-change-08h", "weekend-midnight", "dst-short-night"],
)
def test_cost_splits_at_price_changes(
    prices: PriceSchedule, start: float, end: float, gpus: int, want: float
) -> None:
    assert prices.cost("H100", start, end, gpus=gpus) == pytest.approx(want)


def test_next_cheaper(prices: PriceSchedule) -> None:
    when, price = prices.next_cheaper("H100", at(2026, 12, 2, 12)) or (0.0, 0.0)
    assert (when, price) == (at(2026, 12, 2, 22), 1.0)
    assert parse_prices({"base": {"H100": 1}}).next_cheaper("H100", 0.0) is None


@pytest.mark.parametrize("suffix", [".json", ".toml"], ids=["json", "toml"])
def test_load_file(tmp_path: Path, suffix: str) -> None:
    p = tmp_path / f"prices{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps(SPEC))
    else:
        p.write_text(
            'timezone = "Europe/Berlin"\nweekend = 0.6\npriority_step = 0.1\n'
            '[base]\nH100 = 2.0\n"*" = 1.0\n'
            '[[windows]]\nstart = "22:00"\nend = "08:00"\nmultiplier = 0.5\n'
        )
    assert load_prices(p) == parse_prices(SPEC)


def test_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_prices({"timezone": "UTC", "windows": [{"start": "25:00", "end": "08:00", "multiplier": 1}]})
    assert datetime.fromtimestamp(at(2026, 12, 2, 22), UTC).hour == 21
