"""``sinfo``: partitions (gpufleet's pools) and their nodes, in Slurm's formats.

Rows group the nodes that show the same values in every column but the node ones
(``%N``, ``%n``, ``%D``, ``%F``), as Slurm's do: the default format
(``%#P %.5a %.10l %.6D %.6t %N``) gives one row per pool and node state; ``-N``
one per node; ``-l`` long states; ``-s`` the ``A/I/O/T`` summary; ``-o`` the letters in
``FORMATS`` (``%#X``: as wide as the widest value). The default pool is marked ``*``.
A pool without nodes is one row of 0 nodes in state ``n/a``.

Node states (``scontrol.node_state``): ``idle``, ``mix``, ``alloc`` by GPUs in use,
``drain``/``drng`` for a cordoned or draining node, ``down`` for one not ready or lost.
Pools have no time limit of their own: ``infinite``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from gpufleet.slurm import hostlist
from gpufleet.slurm._common import SlurmError, connect, run
from gpufleet.slurm.scontrol import features_of, node_state

PROG = "sinfo"
DEFAULT = "%#P %.5a %.10l %.6D %.6t %N"
NODES = "%#N %.6D %#P %6t"
NODES_LONG = "%#N %.6D %#P %.11T %.4c %.8z %.6m %.8d %.6w %.8f %20E"
LONG = "%#P %.5a %.10l %.6D %.11T %N"
SUMMARY = "%#P %.5a %.10l %.16F %N"

_SHORT = {"IDLE": "idle", "MIXED": "mix", "ALLOCATED": "alloc", "DOWN": "down", "DRAIN": "drain"}
_SHORT["DRAINING"] = "drng"
_LONG_STATE = {"DRAIN": "drained", "DRAINING": "draining"}

Node = dict[str, Any]
Field = Callable[[Node, str], object]
"""(node, its pool's shown name) -> value; a pool without nodes is an empty node."""


def _state(node: Node) -> str:
    return node_state(node) if node else ""


FORMATS: dict[str, tuple[str, Field]] = {
    "P": ("PARTITION", lambda n, p: p),
    "R": ("PARTITION", lambda n, p: p.rstrip("*")),
    "a": ("AVAIL", lambda n, p: "up"),
    "l": ("TIMELIMIT", lambda n, p: "infinite"),
    "t": ("STATE", lambda n, p: _SHORT.get(_state(n), "n/a")),
    "T": ("STATE", lambda n, p: _LONG_STATE.get(_state(n), _state(n).lower() or "n/a")),
    "c": ("CPUS", lambda n, p: n.get("cpus") or 0),
    "m": ("MEMORY", lambda n, p: n.get("memory_mb") or 0),
    "G": (
        "GRES",
        lambda n, p: (
            f"gpu:{str(n.get('model') or 'gpu').lower()}:{n['gpus_total']}"
            if n.get("gpus_total")
            else "(null)"
        ),
    ),
    "f": ("AVAIL_FEATURES", lambda n, p: ",".join(features_of(n)) or "(null)"),
    "E": ("REASON", lambda n, p: n.get("cordon_reason") or "none"),
    "z": ("S:C:T", lambda n, p: f"1:{n.get('cpus') or 0}:1" if n else "0:0:0"),
    "d": ("TMP_DISK", lambda n, p: 0),
    "w": ("WEIGHT", lambda n, p: 1),
    "s": ("JOB_SIZE", lambda n, p: "1-infinite"),
}
"""``-o`` letters that are a node's own value (rows group on them)."""
_GROUP = {"N": "NODELIST", "n": "HOSTNAMES", "D": "NODES", "F": "NODES(A/I/O/T)"}
"""Letters that sum up a row's nodes."""
_SPEC = re.compile(r"%(\.)?(#)?(-)?(\d+)?([a-zA-Z%])")

Column = tuple[str, str, str]
"""(literal text before it, letter, width: digits, ``#`` or ``""``), right-aligned
if the width starts with ``.``."""


def parse_format(spec: str) -> tuple[list[tuple[str, str, int | None, bool, bool]], str]:
    """(literal, letter, width, right, widest) of each column; the text after them."""
    cols: list[tuple[str, str, int | None, bool, bool]] = []
    pos, text = 0, ""
    for m in _SPEC.finditer(spec):
        text += spec[pos : m.start()]
        pos = m.end()
        letter = m.group(5)
        if letter == "%":
            text += "%"
            continue
        if letter not in FORMATS and letter not in _GROUP:
            raise SlurmError(f"Invalid node format specification: {letter}")
        width = int(m.group(4)) if m.group(4) else None
        cols.append((text, letter, width, bool(m.group(1)), bool(m.group(2))))
        text = ""
    return cols, text + spec[pos:]


def _summary(nodes: list[Node]) -> str:
    states = [node_state(n) for n in nodes]
    busy = sum(s in ("MIXED", "ALLOCATED") for s in states)
    idle = sum(s == "IDLE" for s in states)
    return f"{busy}/{idle}/{len(nodes) - busy - idle}/{len(nodes)}"


def rows(pools: list[dict[str, Any]], nodes: list[Node], spec: str, *, per_node: bool) -> list[list[str]]:
    """The table (header first) of ``spec`` over the pools and their nodes."""
    cols, _ = parse_format(spec)
    own = [c for c in cols if c[1] in FORMATS]
    table: list[list[str]] = [[(FORMATS[c[1]][0] if c[1] in FORMATS else _GROUP[c[1]]) for c in cols]]
    for pool in pools:
        shown = str(pool["name"]) + ("*" if pool.get("default") else "")
        members = [n for n in nodes if n.get("pool") == pool["name"]]
        groups: dict[tuple[str, ...], list[Node]] = {}
        for n in members:
            key = tuple(str(FORMATS[c[1]][1](n, shown)) for c in own)
            groups.setdefault((str(n["name"]), *key) if per_node else key, []).append(n)
        if not members and not per_node:
            groups[tuple(str(FORMATS[c[1]][1]({}, shown)) for c in own)] = []
        for group in groups.values():
            sample = group[0] if group else {}
            names = [str(n["name"]) for n in group]
            row = []
            for c in cols:
                letter = c[1]
                if letter in ("N", "n"):
                    row.append(hostlist.compress(names) if letter == "N" else ",".join(names))
                elif letter == "D":
                    row.append(str(len(group)))
                elif letter == "F":
                    row.append(_summary(group))
                else:
                    row.append(str(FORMATS[letter][1](sample, shown)))
            table.append(row)
    return table


def render(table: list[list[str]], spec: str, *, header: bool) -> list[str]:
    cols, tail = parse_format(spec)
    widest = [max(len(r[i]) for r in table) for i in range(len(cols))]
    lines = []
    for row in table[0 if header else 1 :]:
        parts = []
        for i, ((lit, _, width, right, most), value) in enumerate(zip(cols, row, strict=True)):
            w = widest[i] if most else width
            text = value if w is None else value[:w]
            parts.append(lit + (text if w is None else (text.rjust(w) if right else text.ljust(w))))
        lines.append(("".join(parts) + tail).rstrip())
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, add_help=False, description="Partitions and nodes.")
    p.add_argument("--help", action="help", help="Show this help.")
    p.add_argument("-h", "--noheader", action="store_true", help="No header line.")
    p.add_argument("-N", "--Node", action="store_true", help="One row per node.")
    p.add_argument("-l", "--long", action="store_true", help="Long states and more columns.")
    p.add_argument("-s", "--summarize", action="store_true", help="Nodes as allocated/idle/other/total.")
    p.add_argument("-o", "--format", help="Columns, Slurm's letters.")
    p.add_argument("-p", "--partition", action="append", default=[], help="Only these pools (comma list).")
    p.add_argument("-n", "--nodes", help="Only these nodes (a hostlist).")
    p.add_argument("-a", "--all", action="store_true", help="Accepted: every pool is shown already.")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return run(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    if args.format:
        spec = args.format
    elif args.Node:
        spec = NODES_LONG if args.long else NODES
    else:
        spec = SUMMARY if args.summarize else (LONG if args.long else DEFAULT)
    parse_format(spec)  # a bad letter before any request
    wanted = {x.strip() for v in args.partition for x in v.split(",") if x.strip()}
    only = set(hostlist.expand(args.nodes)) if args.nodes else None
    with connect() as c:
        pools = c.pages("/pools")
        nodes = c.pages("/nodes")
    if wanted:
        pools = [p for p in pools if p["name"] in wanted]
    if only is not None:
        nodes = [n for n in nodes if n["name"] in only]
        pools = [p for p in pools if any(n.get("pool") == p["name"] for n in nodes)]
    out = render(rows(pools, nodes, spec, per_node=args.Node), spec, header=not args.noheader)
    if args.long and not args.noheader:
        out.insert(0, time.strftime("%a %b %d %H:%M:%S %Y"))
    sys.stdout.write("".join(f"{line}\n" for line in out))
    return 0


__all__ = ["DEFAULT", "FORMATS", "main", "parse_format", "render", "rows"]
