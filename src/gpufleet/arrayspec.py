"""Slurm's ``--array`` specification: ``0-15``, ``0,6,16-32``, ``0-15:4`` (a step),
``0-99%10`` (at most 10 tasks at once), ``1-5,7%2``. Used by the CLI (to refuse a bad
one locally) and the server (to expand it); standard library only.

Limits (Slurm's ``MaxArraySize`` is 1001 by default, indices 0-1000): indices 0 to
``MAX_INDEX``, at most ``MAX_TASKS`` tasks per array.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_INDEX = 1_000_000
MAX_TASKS = 10_000
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]
    """The task ids, ascending, each once."""
    limit: int = 0
    """``%N``: at most this many tasks run at once (0: no limit)."""

    def __str__(self) -> str:
        return compact(self.indices) + (f"%{self.limit}" if self.limit else "")


def parse_array(text: str) -> ArraySpec:
    """Raises ValueError with the words to show."""
    raw = text.strip()
    body, pct, limit_text = raw.partition("%")
    limit = 0
    if pct:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"--array={raw}: the limit after % must be a whole number >= 1")
        limit = int(limit_text)
    if not body:
        raise ValueError(f"--array={raw}: expected task ids such as 0-15, 0,6,16-32, 0-15:4 or 0-99%10")
    ids: set[int] = set()
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"--array={raw}: {part.strip()!r} is not an index or range (5, 0-15, 0-15:4)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise ValueError(f"--array={raw}: range {lo}-{hi} goes down")
        if step < 1:
            raise ValueError(f"--array={raw}: the step after : must be >= 1")
        if hi > MAX_INDEX:
            raise ValueError(f"--array={raw}: task ids go up to {MAX_INDEX}")
        if (hi - lo) // step + 1 + len(ids) > MAX_TASKS:
            raise ValueError(f"--array={raw}: at most {MAX_TASKS} tasks in one array")
        ids.update(range(lo, hi + 1, step))
    return ArraySpec(tuple(sorted(ids)), limit)


def compact(indices: list[int] | tuple[int, ...]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``1-3,5,7-8`` (as ``squeue`` shows a pending array)."""
    out: list[str] = []
    it = sorted(set(indices))
    i = 0
    while i < len(it):
        j = i
        while j + 1 < len(it) and it[j + 1] == it[j] + 1:
            j += 1
        out.append(str(it[i]) if i == j else f"{it[i]}-{it[j]}")
        i = j + 1
    return ",".join(out)


def runs_text(runs: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> str:
    """Ascending, disjoint runs of task ids ``(first, last)`` -> ``1-3,7,9-12`` (what
    ``compact`` makes of their indices, from the runs a database computed)."""
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)
