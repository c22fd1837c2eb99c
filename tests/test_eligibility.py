"""When a waiting job may start by the clock (``server/loops/eligibility.py``),
table-driven: --begin (BeginTime), --deadline (cancelled once it cannot end in time),
--max-price (waits for the off-peak window, or starts anyway for its deadline)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpufleet.server.decide.pricing import PriceSchedule, PriceWindow
from gpufleet.server.loops.eligibility import Timed, judge

# 2026-12-07 is a Monday; 10:00 UTC: peak (price 4 x 1.0); 22:00-06:00 off-peak x 0.25
MON_10 = dt.datetime(2026, 12, 7, 10, 0, tzinfo=dt.UTC).timestamp()
MON_22 = dt.datetime(2026, 12, 7, 22, 0, tzinfo=dt.UTC).timestamp()
PRICES = PriceSchedule(
    base={"H100": 4.0}, windows=(PriceWindow(start="22:00", end="06:00", multiplier=0.25),)
)


def timed(**kw: object) -> Timed:
    base: dict[str, object] = {
        "id": 1,
        "begin_at": None,
        "deadline": None,
        "max_price": None,
        "time_limit_s": 3600.0,
        "gpu_type": None,
        "pool": "p",
        "priority": 0,
    }
    return Timed(**(base | kw))  # type: ignore[arg-type]


# kwargs, held code (None: may start), not_before, cancelled
CASES = [
    ("nothing", {}, None, None, False),
    ("begin-later", {"begin_at": MON_10 + 600}, "BeginTime", MON_10 + 600, False),
    ("begin-past", {"begin_at": MON_10 - 600}, None, None, False),
    ("deadline-met", {"deadline": MON_10 + 7200}, None, None, False),
    ("deadline-missed", {"deadline": MON_10 + 1800}, None, None, True),
    ("cheap-enough-now", {"max_price": 4.0}, None, None, False),
    ("waits-for-off-peak", {"max_price": 1.0}, "Price", MON_22, False),
    (
        "deadline-before-off-peak",
        {"max_price": 1.0, "deadline": MON_10 + 4 * 3600},
        "Price",
        MON_10 + 3 * 3600,
        False,
    ),
    ("deadline-forces-start", {"max_price": 1.0, "deadline": MON_10 + 3600}, None, None, False),
    ("never-cheap-enough", {"max_price": 0.5}, "Price", None, False),
    ("named-model", {"max_price": 1.0, "gpu_type": "A100"}, None, None, False),  # A100: no price
]


@pytest.mark.parametrize(
    ("kw", "code", "not_before", "cancelled"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_clock_and_the_price_decide(
    kw: dict[str, object], code: str | None, not_before: float | None, cancelled: bool
) -> None:
    held, cancel = judge([timed(**kw)], now=MON_10, schedule=PRICES, pool_models={"p": ["H100"]})
    assert (1 in cancel) == cancelled
    if cancelled:
        assert cancel[1].startswith("Deadline: cannot end by")
        return
    got = held.get(1)
    assert (got.code if got else None) == code
    if got is not None:
        assert got.not_before == not_before and got.detail


def test_without_a_price_schedule_every_price_is_met() -> None:
    held, cancel = judge([timed(max_price=0.0)], now=MON_10, schedule=None, pool_models={"p": ["H100"]})
    assert not held and not cancel
