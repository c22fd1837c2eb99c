"""Durations as people and Slurm write them."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str, *, bare_unit_s: float = 1.0) -> float:
    """Seconds in ``text``: ``90``/``90s``, ``30m``, ``2h``, ``1h30m``, ``1.5d``, or Slurm's
    ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``. A bare number counts in
    ``bare_unit_s`` (seconds by default; Slurm's ``--time=90`` means minutes: pass 60).

    Raises ValueError with the offending text.
    """
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration")
    if s.replace(".", "", 1).isdigit():
        return float(s) * bare_unit_s
    if _HUMAN.fullmatch(s) or re.fullmatch(r"(?:\d+(?:\.\d+)?[smhdw])+", s):
        return float(sum(float(n) * _UNITS[u] for n, u in _HUMAN.findall(s)))
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", s)
    if m:
        days, a, b, c = m.groups()
        if days is not None:  # D-HH[:MM[:SS]]
            h, mi, sec = int(a), int(b or 0), int(c or 0)
            return float(int(days) * 86400 + h * 3600 + mi * 60 + sec)
        if c is not None:  # HH:MM:SS
            return float(int(a) * 3600 + int(b) * 60 + int(c))
        if b is not None:  # MM:SS
            return float(int(a) * 60 + int(b))
    raise ValueError(f"cannot read duration {text!r} (try 90s, 30m, 2h, 1d or D-HH:MM:SS)")


def format_duration(seconds: float) -> str:
    s = round(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"
