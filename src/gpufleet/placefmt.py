"""Where a job was placed, as its ``placed`` job event says it.

The scheduling pass writes ``placed on node-a[0-3] node-b[0-3] (default)`` (a CPU job:
``placed on node-a (cpu)``); ``gpufleet jobs show`` reads it back to tell where an ended
job ran, since its allocation rows go when it lets its GPUs go. Writer and reader live
here together so the text and its parser cannot drift apart. The reader also takes the
older ``node-a[0, 1, 2]`` lists.

An event's reason holds 512 characters: a job on very many nodes has its list cut, and
``Placed.complete`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_PREFIX = "placed on "
_REASON = re.compile(r"placed on (?P<where>.+?)(?: \((?P<how>[^()]*)\))?")
_ITEM = re.compile(r"(?P<node>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<gpus>[0-9, -]*)\])?(?:\s+|$)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Placed:
    """Nodes, each with its GPU indexes (empty: a CPU job), in the event's order."""

    nodes: tuple[tuple[str, tuple[int, ...]], ...]
    complete: bool = True
    """False: the event's text was cut (the job spans more nodes than it names)."""


def gpu_ranges(gpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``0-3,6``."""
    out: list[str] = []
    run: list[int] = []
    for g in sorted(set(gpus)):
        if run and g == run[-1] + 1:
            run.append(g)
            continue
        if run:
            out.append(_run(run))
        run = [g]
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def _indexes(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        a, dash, b = part.partition("-")
        out += range(int(a), int(b) + 1) if dash else [int(a)]
    return tuple(out)


def placed_reason(where: Sequence[tuple[str, Sequence[int]]], *, how: str) -> str:
    """The ``placed`` event's reason: each node with its GPUs (none: a CPU job), and the
    policy (or ``cpu``) that placed it."""
    nodes = " ".join(f"{n}[{gpu_ranges(g)}]" if g else n for n, g in where)
    return f"{_PREFIX}{nodes} ({how})"


def parse_placed(reason: str) -> Placed | None:
    """The placement a ``placed`` event's reason names; None for any other reason."""
    m = _REASON.fullmatch(reason.strip())
    if m is None:
        return None
    where, complete = m.group("where"), m.group("how") is not None
    nodes: list[tuple[str, tuple[int, ...]]] = []
    pos = 0
    item = None
    while pos < len(where) and (item := _ITEM.match(where, pos)) is not None:
        gpus = item.group("gpus")
        try:
            nodes.append((item.group("node"), _indexes(gpus) if gpus else ()))
        except ValueError:  # not a list this module wrote
            return None
        pos = item.end()
    if not complete and nodes and item is not None and item.group("gpus") is None:
        nodes.pop()  # text cut at the end: the last name may be cut short
    return Placed(nodes=tuple(nodes), complete=complete) if nodes else None


__all__ = ["Placed", "gpu_ranges", "parse_placed", "placed_reason"]
