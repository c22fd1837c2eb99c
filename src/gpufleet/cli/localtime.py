"""Times as the CLI reads and shows them: in the caller's zone (``TZ``, else the
system's). The API and the database hold UNIX seconds (UTC)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpufleet.timefmt import parse_duration


def local_zone() -> str:
    """The caller's IANA zone: ``TZ`` if it names one, else /etc/localtime's target."""
    tz = os.environ.get("TZ", "").lstrip(":")
    candidates = [tz] if tz else []
    try:
        target = str(Path("/etc/localtime").resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for name in candidates:
        try:
            ZoneInfo(name)
            return name
        except (ZoneInfoNotFoundError, ValueError):
            continue
    return "UTC"


def parse_start(text: str, *, zone: str, now: float) -> float:
    """``+2h`` (from now) or an ISO time; a time without an offset is local in ``zone``."""
    text = text.strip()
    if text.startswith("+"):
        return now + parse_duration(text[1:])
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"cannot read start {text!r} (try 2026-12-03T09:00 or +2h)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=ZoneInfo(zone))
    return dt.timestamp()


def show_time(ts: float, zone: str) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")


__all__ = ["local_zone", "parse_start", "show_time"]
