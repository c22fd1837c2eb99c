"""Values of Slurm's batch options as ``sbatch(1)`` reads them: memory sizes, signals,
points in time. Used by the CLI (to refuse a bad value locally, with the words of the
flag) and by the server (the authority); standard library only. Each parser raises
ValueError with the words to show.
"""

from __future__ import annotations

import datetime as dt
import re
import signal as _signal

_MEM = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?$", re.IGNORECASE)
_MEM_UNITS = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}
MAX_MEM_MB = 2**31 - 1


def parse_mem(text: str, *, flag: str = "--mem") -> int:
    """MiB in ``text``: ``16000`` (Slurm's default unit is megabytes), ``16G``, ``512M``,
    ``1.5T``, ``64GB``. 0 is refused here: ``--mem=0`` (Slurm's "all of each node's
    memory") is the callers' to read before (``cli/slurmvalues``, ``server/services/submitopts``)."""
    m = _MEM.match(text.strip())
    if m is None:
        raise ValueError(f"{flag}={text}: expected a size such as 16G, 512M or 16000 (megabytes)")
    mb = float(m.group(1)) * _MEM_UNITS[m.group(2).lower()]
    if mb < 1:
        raise ValueError(f"{flag}={text}: give a size of at least 1M")
    if mb > MAX_MEM_MB:
        raise ValueError(f"{flag}={text}: more memory than any node has")
    return int(mb + 0.999)


_SIGNAL = re.compile(r"^(?:(B|R|RB|BR):)?([A-Za-z0-9]+)(?:@(\d+))?$", re.IGNORECASE)
SIGNALS = {
    s.name.removeprefix("SIG"): int(s)
    for s in _signal.Signals
    if s.name.startswith("SIG") and "_" not in s.name
}


def parse_signal(text: str) -> str:
    """``--signal=[{R|B}:]SIG[@TIME]`` in canonical form ``[B:]NAME@SECONDS``: the
    signal (a name with or without SIG, or a number) is sent TIME seconds (default 60)
    before the time limit; ``B:`` sends it to the batch shell only, else to every
    process of the job. ``R:`` (no requeue on reservation ends) has no meaning here and
    is refused."""
    m = _SIGNAL.match(text.strip())
    if m is None:
        raise ValueError(f"--signal={text}: expected [B:]SIG[@SECONDS], e.g. B:USR1@120")
    scope, sig, secs = m.groups()
    if scope is not None and "R" in scope.upper():
        raise ValueError(f"--signal={text}: R: (reservation) is not supported; use B: or nothing")
    name = sig.upper().removeprefix("SIG")
    if sig.isdigit():
        num = int(sig)
        name = next((n for n, v in SIGNALS.items() if v == num), "")
    if name not in SIGNALS:
        raise ValueError(f"--signal={text}: unknown signal {sig!r} (e.g. USR1, TERM, 10)")
    seconds = int(secs) if secs is not None else 60
    if seconds > 65535:
        raise ValueError(f"--signal={text}: at most 65535 seconds before the time limit")
    return f"{'B:' if scope else ''}{name}@{seconds}"


def signal_parts(canonical: str) -> tuple[bool, int, int]:
    """(batch shell only, signal number, seconds before the limit) of ``parse_signal``'s form."""
    batch, _, rest = canonical.rpartition(":")
    name, _, secs = rest.partition("@")
    return batch == "B", SIGNALS[name], int(secs or 60)


_REL = re.compile(r"^now(?:\+(\d+)\s*(seconds?|minutes?|hours?|days?|weeks?|[smhdw])?)?$")
_REL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NAMED = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0), "elevenses": (11, 0), "fika": (15, 0)}


def parse_when(text: str, *, now: float, tz: dt.tzinfo | None = None, flag: str = "--begin") -> float:
    """A point in time as ``--begin``/``--deadline`` take it: ``now+1hour``, ``now+30``
    (seconds), ``16:00`` / ``16:00:30`` (today, or tomorrow once passed), ``midnight``,
    ``noon``, ``teatime``, ``today``, ``tomorrow``, ``2026-12-05``, ``2026-12-05T16:00[:SS]``.
    Wall-clock forms are in ``tz`` (default: this machine's local time)."""
    s = text.strip().lower()
    m = _REL.match(s)
    if m is not None:
        n = int(m.group(1) or 0)
        unit = (m.group(2) or "s")[0]
        return now + n * _REL_UNITS[unit]
    here = (
        dt.datetime.fromtimestamp(now, tz=tz)
        if tz is not None
        else dt.datetime.fromtimestamp(now).astimezone()
    )
    zone = here.tzinfo
    if s in ("today", "tomorrow"):
        day = here.date() + dt.timedelta(days=1 if s == "tomorrow" else 0)
        return dt.datetime.combine(day, dt.time(0, 0), tzinfo=zone).timestamp()
    hm: tuple[int, int, int] | None = None
    if s in _NAMED:
        hm = (*_NAMED[s], 0)
    elif (t := re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", s)) is not None:
        hm = (int(t.group(1)), int(t.group(2)), int(t.group(3) or 0))
    if hm is not None:
        try:
            at = here.replace(hour=hm[0], minute=hm[1], second=hm[2], microsecond=0)
        except ValueError:
            raise ValueError(f"{flag}={text}: not a time of day") from None
        if at.timestamp() <= now:
            at += dt.timedelta(days=1)
        return at.timestamp()
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{flag}={text}: expected now+1hour, 16:00, midnight, tomorrow or 2026-12-05T16:00"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone)
    return when.timestamp()
