"""Times as the CLI reads and shows them: in the caller's zone (``TZ``, else the
system's). The API and the database hold UNIX seconds (UTC)."""

from __future__ import annotations

import os
import re
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


_SLURM_REL = re.compile(r"^now\s*([+-])\s*(\d+)\s*([a-z]*)$")
_SLURM_UNITS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 604800),
}
_SLURM_DATE = re.compile(
    r"^(\d{2})([/.]?)(\d{2})(?:\2(\d{2}))?(?:-(\d{1,2}):(\d{2})(?::(\d{2}))?)?$"
)  # MMDD[YY], MM/DD[/YY], MM.DD[.YY], each with an optional -HH:MM[:SS]
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_NAMED = {"midnight": "0:00", "noon": "12:00", "elevenses": "11:00", "fika": "15:00", "teatime": "16:00"}


def parse_slurm_time(text: str, *, now: float, flag: str, future: bool) -> float:
    """A point in time as Slurm's commands take it, in this machine's local time:
    ``now[+-]N[unit]`` (seconds by default), ``MMDD[YY]``, ``MM/DD[/YY][-HH:MM[:SS]]``,
    ``MM.DD[.YY]``, and every form of ``slurmopts.parse_when`` (``16:00``, ``midnight``,
    ``tomorrow``, ``2026-12-05T16:00``). ``future``: a date or time of day already
    passed means its next one (``sbatch --begin``), else the last one (``sacct -S``)."""
    s = text.strip().lower()
    if (m := _SLURM_REL.match(s)) is not None:
        sign, count, unit = m.groups()
        if unit not in _SLURM_UNITS:
            raise ValueError(f"{flag}={text}: unknown unit {unit!r} (seconds, minutes, hours, days, weeks)")
        return now + (1 if sign == "+" else -1) * int(count) * _SLURM_UNITS[unit]
    here = datetime.fromtimestamp(now).astimezone()
    if (m := _SLURM_DATE.match(s)) is not None:
        month, _, day, year, hour, minute, second = m.groups()
        try:
            at = here.replace(
                year=2000 + int(year) if year else here.year,
                month=int(month),
                day=int(day),
                hour=int(hour or 0),
                minute=int(minute or 0),
                second=int(second or 0),
                microsecond=0,
            )
        except ValueError:
            raise ValueError(f"{flag}={text}: not a date (MMDD[YY], MM/DD[/YY][-HH:MM[:SS]])") from None
        if year is None and future and at.timestamp() < now:
            at = at.replace(year=at.year + 1)
        return at.timestamp()
    if not future and (m := _CLOCK.match(_NAMED.get(s, s))) is not None:
        try:
            at = here.replace(hour=int(m[1]), minute=int(m[2]), second=int(m[3] or 0), microsecond=0)
        except ValueError:
            raise ValueError(f"{flag}={text}: not a time of day") from None
        return at.timestamp()
    from gpufleet.slurmopts import parse_when

    return parse_when(text, now=now, tz=None, flag=flag)


__all__ = ["local_zone", "parse_slurm_time", "parse_start", "show_time"]
