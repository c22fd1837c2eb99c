"""Slurm's hostlists: ``node-[001-003,007]`` <-> ``node-001 node-002 node-003 node-007``.

Pure and standard library only: ``scontrol show hostnames`` runs at every task start
(``MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)``) and asks
no server.

Expansion reads Slurm's syntax: names separated by commas outside brackets; each
bracket holds comma-separated numbers and ``LO-HI`` ranges; a range keeps the width of
its lower bound (``[001-010]`` is ``001 ... 010``, ``[8-10]`` is ``8 9 10``); several
brackets in one name multiply out left to right (``r[1-2]n[1-2]``: ``r1n1 r1n2 r2n1
r2n2``), as Slurm's hostlist does.

Compression is the reverse for the one-bracket case: names that end in a number and
share what comes before it (and, for zero-padded numbers, the width) are joined into one
bracket, in the order given, runs as ranges (``node-[001-003,007]``). Slurm keeps the
order it was given too (``scontrol show hostlist b1,a1,b2`` is ``b1,a1,b2``): only
neighbours with the same prefix share a bracket, and a name that is not one of them
closes it.
"""

from __future__ import annotations

import re

MAX_HOSTS = 1_000_000
"""An expansion bigger than this is refused (``node[0-999999999]`` is a typo, not a
cluster)."""

_TAIL = re.compile(r"^(.*?)(\d+)$")


def _split_top(text: str) -> list[str]:
    """``text`` cut at the commas outside brackets; ValueError on unbalanced brackets."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"{text}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{text}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{text}: '[' without ']'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _numbers(inside: str, whole: str) -> list[str]:
    """The numbers of one bracket, as text of their width."""
    out: list[str] = []
    for part in inside.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{whole}: [{inside}] holds numbers and LO-HI ranges")
        if not dash:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"{whole}: range {lo}-{hi} goes down")
        if len(out) + b - a + 1 > MAX_HOSTS:
            raise ValueError(f"{whole}: more than {MAX_HOSTS} hosts")
        width = len(lo)
        out += [str(n).zfill(width) for n in range(a, b + 1)]
    return out


def _expand_one(name: str) -> list[str]:
    open_ = name.find("[")
    if open_ < 0:
        return [name]
    close = name.index("]", open_)
    head, inside, rest = name[:open_], name[open_ + 1 : close], name[close + 1 :]
    tails = _expand_one(rest)
    out: list[str] = []
    for number in _numbers(inside, name):
        out += [f"{head}{number}{tail}" for tail in tails]
        if len(out) > MAX_HOSTS:
            raise ValueError(f"{name}: more than {MAX_HOSTS} hosts")
    return out


def expand(text: str) -> list[str]:
    """Every host a hostlist names, in order (duplicates kept, as Slurm's
    ``show hostnames``). Raises ValueError naming what it cannot read."""
    out: list[str] = []
    for part in _split_top(text.strip()):
        out += _expand_one(part)
        if len(out) > MAX_HOSTS:
            raise ValueError(f"{text[:80]}: more than {MAX_HOSTS} hosts")
    return out


def _key(name: str) -> tuple[str, int, int] | None:
    """(prefix, number, width: 0 unless zero-padded) of a name that ends in a number."""
    m = _TAIL.match(name)
    if m is None:
        return None
    digits = m.group(2)
    padded = len(digits) > 1 and digits.startswith("0")
    return m.group(1), int(digits), len(digits) if padded else 0


def _ranges(numbers: list[int], width: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        lo, hi = str(numbers[i]).zfill(width), str(numbers[j]).zfill(width)
        out.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return ",".join(out)


def compress(names: list[str]) -> str:
    """The hostlist of ``names`` (see the module docstring); ``""`` for none."""
    out: list[str] = []
    group: tuple[str, int] | None = None  # (prefix, width) of the bracket being filled
    numbers: list[int] = []

    def close() -> None:
        if group is not None:
            prefix, width = group
            if len(numbers) == 1:
                out.append(f"{prefix}{str(numbers[0]).zfill(width)}")
            else:
                out.append(f"{prefix}[{_ranges(numbers, width)}]")

    for name in names:
        key = _key(name)
        if key is not None and group == (key[0], key[2]) and key[1] not in numbers:
            numbers.append(key[1])
            continue
        close()
        if key is None:
            group, numbers = None, []
            out.append(name)
        else:
            group, numbers = (key[0], key[2]), [key[1]]
    close()
    return ",".join(out)


__all__ = ["MAX_HOSTS", "compress", "expand"]
