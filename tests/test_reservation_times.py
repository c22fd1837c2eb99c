"""Reservation times: local wall-clock input, UTC storage, repeats across DST."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from gpufleet.cli.reservation_cmds import local_zone, parse_start, show_time
from gpufleet.server.services.reservations import windows

BERLIN = "Europe/Berlin"


def _utc_hours(ws: list[tuple[float, float]]) -> list[str]:
    return [datetime.fromtimestamp(s, UTC).strftime("%m-%d %H:%M") for s, _ in ws]


@pytest.mark.parametrize(
    ("repeat", "count", "want_utc"),
    [
        ("daily", 3, ["03-28 08:00", "03-29 07:00", "03-30 07:00"]),  # CET -> CEST on 03-29
        ("weekly", 2, ["03-28 08:00", "04-04 07:00"]),
        (None, 5, ["03-28 08:00"]),  # no repeat: count ignored
    ],
    ids=["daily-across-dst", "weekly-across-dst", "single"],
)
def test_repeat_keeps_local_wall_clock(repeat: str | None, count: int, want_utc: list[str]) -> None:
    start = parse_start("2026-03-28T09:00", zone=BERLIN, now=0.0)
    ws = windows(start=start, duration_s=3600, repeat=repeat, count=count, tz=BERLIN)
    assert _utc_hours(ws) == want_utc
    assert {datetime.fromtimestamp(s, ZoneInfo(BERLIN)).strftime("%H:%M") for s, _ in ws} == {"09:00"}
    assert all(e - s == 3600 for s, e in ws)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("+2h", 1000.0 + 7200),
        ("2026-12-03T09:00", datetime(2026, 12, 3, 8, 0, tzinfo=UTC).timestamp()),  # CET = UTC+1
        ("2026-12-03T09:00+00:00", datetime(2026, 12, 3, 9, 0, tzinfo=UTC).timestamp()),
    ],
    ids=["relative", "local", "explicit-offset"],
)
def test_parse_start(text: str, want: float) -> None:
    assert parse_start(text, zone=BERLIN, now=1000.0) == want


def test_show_time_is_local_and_zone_from_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", BERLIN)
    assert local_zone() == BERLIN
    assert show_time(datetime(2026, 7, 1, 7, 0, tzinfo=UTC).timestamp(), BERLIN) == "2026-07-01 09:00 CEST"


def test_bad_start_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot read start"):
        parse_start("tomorrow-ish", zone="UTC", now=0.0)
