"""Known failure signatures in a job's output, and the matcher (issue 34).

When a job fails, the tail of its output is read against a table of signatures: each
an ``id``, a regular expression, a short diagnosis, a hint, a priority and whom it
blames: ``node`` (the hardware or its firmware: a GPU that fell off the bus, an
uncorrectable ECC error, an InfiniBand completion error), ``job`` (the job's own code:
an out-of-bounds access, CUDA out of memory) or ``unknown`` (either: an NCCL timeout is
usually a symptom of another rank's failure). Only ``node`` findings count toward a
node's suspicion (the server's ``services/diagnoses.py``).

The built-in table (``BUILTIN``) carries lines seen in the field; each has a test with a
real excerpt (``tests/data/diagnosis/``, whose README cites where each comes from).
Operators add or replace signatures in a TOML file (``load_rules``, ``gpufleet server
--diagnosis-rules FILE``)::

    [[signature]]
    id = "nccl-socket-timeout"        # [a-z0-9._-], replaces a built-in of the same id
    pattern = 'NCCL WARN .*socket timed out'
    diagnosis = "an NCCL socket connection timed out"
    hint = "check the node's Ethernet link and NCCL_SOCKET_IFNAME"
    blame = "node"                    # node | job | unknown
    priority = 60                     # 0..100: the highest of several matches wins

A bad entry is skipped and reported (``RuleFile.skipped``), never the whole file.

**The output is hostile.** Its author knows the table: matching must cost little
whatever the bytes are. Python's ``re`` backtracks and has no time limit, so:

- only the last ``TAIL_CHARS`` of the output are read, line by line (``\\n``, ``\\r``
  and NUL end a line: a progress bar's carriage returns, binary output), each line cut
  at ``LINE_MAX`` characters;
- an operator's pattern is refused when its shape can backtrack badly: a back
  reference, a repeat inside a repeat, alternatives inside a repeat, more than two wide
  repeats (``{n,}``, ``*``, ``+``, or more than 16), or no literal of at least 3
  characters that every match contains (the *needle*: a line without it is never given
  to the regular expression); and when it takes more than ``PROBE_S`` on probe lines
  built from its own characters (what is left of polynomial backtracking);
- one tail's matching stops after ``budget_s`` (checked between lines) and says so.
"""

from __future__ import annotations

import importlib
import re
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Blame = Literal["node", "job", "unknown"]
BLAMES: tuple[Blame, ...] = ("node", "job", "unknown")
TAIL_CHARS = 64 * 1024
"""How much of the end of a job's output is read."""
LINE_MAX = 1024
"""A longer line is matched on its first this many characters."""
SHOWN_MAX = 300
"""A finding's line is cut to this (printable characters only)."""
PATTERN_MAX = 256
PROBE_S = 0.02
WIDE = 16
"""A repeat that may match more than this many times is *wide*."""
MAX_WIDE = 2
NEEDLE_MIN = 3
ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
RULES_MAX_BYTES = 1024 * 1024
RULES_MAX_ENTRIES = 500
_KEYS = {"id", "pattern", "diagnosis", "hint", "blame", "priority"}

_sre: Any = importlib.import_module("re._parser")
"""The standard library's regular-expression parser (``sre_parse``, private since 3.11:
imported by name, typed as Any) for the shape checks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Signature:
    id: str
    pattern: str
    diagnosis: str
    hint: str
    blame: Blame
    priority: int
    regex: re.Pattern[str]
    needles: tuple[str, ...]
    """Every match contains one of these (casefolded when ``folded``); () for a
    built-in without one."""
    folded: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """What a failed job's output matched: the best signature and its first line."""

    signature: str
    diagnosis: str
    hint: str
    blame: Blame
    priority: int
    line: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    finding: Finding | None
    lines: int
    """Lines read."""
    exhausted: bool = False
    """The time budget ran out before the last line (the finding may be incomplete)."""


# -- shape checks ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Shape:
    wide: int = 0
    problem: str | None = None
    chars: set[str] | None = None


def _walk(items: Any, in_repeat: bool, shape: _Shape) -> None:
    for op, av in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _lo, hi, body = av
            wide = hi == _sre.MAXREPEAT or hi > WIDE
            shape.wide += wide
            if hi > 1 and in_repeat:
                shape.problem = shape.problem or "a repeat inside a repeat"
            _walk(body, in_repeat or hi > 1, shape)
        elif name == "SUBPATTERN":
            _walk(av[-1], in_repeat, shape)
        elif name == "BRANCH":
            if in_repeat:
                shape.problem = shape.problem or "alternatives inside a repeat"
            for alt in av[1]:
                _walk(alt, in_repeat, shape)
        elif name in ("GROUPREF", "GROUPREF_EXISTS"):
            shape.problem = shape.problem or "a back reference"
        elif name in ("ASSERT", "ASSERT_NOT"):
            _walk(av[1], in_repeat, shape)
        elif name == "ATOMIC_GROUP":
            _walk(av, in_repeat, shape)
        elif name == "LITERAL" and shape.chars is not None:
            shape.chars.add(chr(av))


def _runs(items: Any) -> list[str]:
    """The literal runs of a sequence (plain groups inlined): each is in every match."""
    runs, cur = [], ""
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            cur += chr(av)
        elif name == "SUBPATTERN" and not av[1] and not av[2]:
            inner = _runs(av[-1])
            if len(inner) == 1 and _only_literals(av[-1]):
                cur += inner[0]
            else:
                runs += [cur, *inner]
                cur = ""
        else:
            runs.append(cur)
            cur = ""
    return [r for r in [*runs, cur] if r]


def _only_literals(items: Any) -> bool:
    return all(str(op) == "LITERAL" for op, _ in items)


def needles_of(pattern: str, flags: int = 0) -> tuple[str, ...]:
    """Strings one of which every match of ``pattern`` contains (() if none is known):
    its longest literal run, else, for alternatives at its top, one run per alternative."""
    parsed = _sre.parse(pattern, flags)
    runs = _runs(parsed)
    best = max(runs, key=len, default="")
    if len(best) >= NEEDLE_MIN:
        return (best,)
    items = list(parsed)
    if len(items) == 1 and str(items[0][0]) == "BRANCH":
        per = [max(_runs(alt), key=len, default="") for alt in items[0][1][1]]
        if all(len(p) >= NEEDLE_MIN for p in per):
            return tuple(per)
    return ()


def _fill(unit: str) -> str:
    return (unit * (LINE_MAX // max(1, len(unit)) + 1))[:LINE_MAX]


def _probes(chars: set[str], needles: tuple[str, ...]) -> list[str]:
    """Lines that make a pattern backtrack most: its own characters over and over, each
    time without one of them (a match that needs it fails only after trying all)."""
    seed = "".join(sorted(chars))[:12] or "a"
    seeds = [seed, *(seed.replace(c, "") for c in seed)]
    out = ["a" * LINE_MAX, " " * LINE_MAX]
    for s in seeds:
        out.append(_fill(s))
        out += [_fill(n + " " + s) for n in needles[:4]]
    return out


def compile_signature(
    *,
    id: str,
    pattern: str,
    diagnosis: str,
    hint: str = "",
    blame: str = "unknown",
    priority: int = 50,
    trusted: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> Signature | str:
    """A signature, or why not (a sentence). ``trusted`` (the built-ins) skips the
    shape and probe checks an operator's pattern must pass."""
    if not isinstance(id, str) or not ID.fullmatch(id):
        return f"id {id!r} is not 1-64 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit)"
    if not isinstance(pattern, str) or not 0 < len(pattern) <= PATTERN_MAX:
        return f"pattern must be a string of 1 to {PATTERN_MAX} characters"
    if not isinstance(diagnosis, str) or not 0 < len(diagnosis) <= 200:
        return "diagnosis must be a string of 1 to 200 characters"
    if not isinstance(hint, str) or len(hint) > 300:
        return "hint must be a string of at most 300 characters"
    if blame not in BLAMES:
        return f"blame must be one of {', '.join(BLAMES)}, got {blame!r}"
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
        return f"priority must be an integer from 0 to 100, got {priority!r}"
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        return f"pattern does not compile: {exc}"
    folded = bool(regex.flags & re.IGNORECASE)
    needles = needles_of(pattern)
    if not trusted:
        shape = _Shape(chars=set())
        _walk(_sre.parse(pattern), False, shape)
        if shape.problem is not None:
            return f"pattern may backtrack without end: {shape.problem}"
        if shape.wide > MAX_WIDE:
            return f"pattern has {shape.wide} wide repeats (at most {MAX_WIDE})"
        if not needles:
            return f"pattern has no literal of {NEEDLE_MIN} characters that every match contains"
        for probe in _probes(shape.chars or set(), needles):
            t0 = clock()
            regex.search(probe)
            if (spent := clock() - t0) > PROBE_S:
                return f"pattern is too slow: {spent * 1000:.0f} ms on a {LINE_MAX}-character line"
    return Signature(
        id=id,
        pattern=pattern,
        diagnosis=diagnosis,
        hint=hint,
        blame=blame,
        priority=priority,
        regex=regex,
        needles=tuple(n.casefold() for n in needles) if folded else needles,
        folded=folded,
    )


def _builtin(**kw: Any) -> Signature:
    sig = compile_signature(trusted=True, **kw)
    assert isinstance(sig, Signature), sig
    return sig


# -- the built-in table ---------------------------------------------------------------------------

_NVIDIA_XID = "NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors)"

BUILTIN: tuple[Signature, ...] = (
    _builtin(
        id="not-started",
        pattern=r"^gpufleet: (?:cannot open --(?:output|error|input) .*: not started|cannot start ')",
        diagnosis="the job never started: its account could not open a file it named (--output, --error, "
        "--input) or run its command",
        hint="the job runs as its owner's account (the demo's: nobody), which must be able to write where "
        "--output points (slurm-%j.out in the working directory: pass --chdir or --output to a directory it "
        "can write) and to run the command",
        blame="job",
        priority=97,  # above every other: a job that never started printed nothing else of its own
    ),
    _builtin(
        id="xid-79-fell-off-bus",
        pattern=r"Xid \([^)]*\): 79\b|has fallen off the bus",
        diagnosis="a GPU fell off the bus (XID 79): the node lost it mid-job",
        hint="a node problem (power, heat, PCIe riser, firmware): drain the node, reseat or replace the GPU",
        blame="node",
        priority=95,
    ),
    _builtin(
        id="xid-ecc",
        pattern=r"Xid \([^)]*\): (?:48|63|64|92|94|95)\b",
        diagnosis="the GPU reported a memory ECC error (XID 48, 63, 64, 92, 94 or 95)",
        hint=f"a node problem: reset the GPU; repeated, replace it ({_NVIDIA_XID})",
        blame="node",
        priority=90,
    ),
    _builtin(
        id="cuda-ecc-uncorrectable",
        pattern=r"uncorrectable ECC error encountered|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
        diagnosis="CUDA hit an uncorrectable ECC error in GPU memory",
        hint="a node problem: the GPU needs a reset; if it recurs, replace it",
        blame="node",
        priority=88,
    ),
    _builtin(
        id="xid-nvlink",
        pattern=r"Xid \([^)]*\): (?:74|149)\b|uncorrectable NVLink error",
        diagnosis="an NVLink error between the node's GPUs (XID 74 or 149, or CUDA's uncorrectable "
        "NVLink error)",
        hint=f"a node problem: check the NVLink links (nvidia-smi nvlink -e), reset the GPUs ({_NVIDIA_XID})",
        blame="node",
        priority=85,
    ),
    _builtin(
        id="nccl-ib-completion-error",
        pattern=r"NET/IB\w*\s*:\s*Got completion",
        diagnosis="an InfiniBand/RoCE transfer failed in NCCL (a completion with an error status)",
        hint="usually the NIC, its firmware or cable, or the fabric: check the NIC's firmware and link "
        "counters (status 12 is a retry timeout)",
        blame="node",
        priority=80,
    ),
    _builtin(
        id="cuda-illegal-address",
        pattern=r"an illegal memory access was encountered|cudaErrorIllegalAddress"
        r"|CUDA_ERROR_ILLEGAL_ADDRESS",
        diagnosis="a CUDA kernel accessed memory out of bounds (illegal address)",
        hint="a bug in the job's code or a CUDA extension: rerun with CUDA_LAUNCH_BLOCKING=1 or under "
        "compute-sanitizer",
        blame="job",
        priority=70,
    ),
    _builtin(
        id="cuda-oom",
        pattern=r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|cudaErrorMemoryAllocation"
        r"|CUDA_ERROR_OUT_OF_MEMORY",
        diagnosis="the job ran out of GPU memory (CUDA out of memory)",
        hint="lower the batch size, use activation checkpointing or "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or ask for GPUs with more memory",
        blame="job",
        priority=65,
    ),
    _builtin(
        id="nccl-system-error",
        pattern=r"unhandled system error",
        diagnosis="NCCL hit a system error (a failed system or library call)",
        hint="rerun with NCCL_DEBUG=INFO: common causes are a too small /dev/shm in a container, "
        "missing InfiniBand verbs, a misconfigured NIC",
        blame="unknown",
        priority=50,
    ),
    _builtin(
        id="nccl-watchdog-timeout",
        pattern=r"Watchdog caught collective operation timeout",
        diagnosis="an NCCL collective did not complete within its timeout",
        hint="usually a symptom: another rank failed or stalled first; look for the first error "
        "in the other ranks' output",
        blame="unknown",
        priority=40,
    ),
    _builtin(
        id="xid-other",
        pattern=r"NVRM: Xid \(",
        diagnosis="the NVIDIA driver logged an XID error",
        hint=f"look the code up in {_NVIDIA_XID}: 13, 31 and 43 are usually the application's",
        blame="unknown",
        priority=30,
    ),
    _builtin(
        id="segfault",
        pattern=r"Segmentation fault|SIGSEGV",
        diagnosis="a process crashed on an invalid host memory access (segmentation fault)",
        hint="usually a native extension or mismatched library versions: get a core dump or run under gdb",
        blame="job",
        priority=20,
    ),
)


# -- the matcher ------------------------------------------------------------------------------------


_BREAKS = str.maketrans({"\r": "\n", "\x00": "\n", "\u2400": "\n"})
"""What ends a line besides ``\\n``: a carriage return (progress bars), a NUL (binary
output; the server stores it as U+2400, the symbol for NUL)."""


def lines_of(text: str, *, tail: int = TAIL_CHARS) -> list[str]:
    """The last ``tail`` characters of ``text`` as lines, each cut at ``LINE_MAX``."""
    text = text[-tail:].translate(_BREAKS)
    return [line[:LINE_MAX] for line in text.split("\n") if line]


def shown(line: str) -> str:
    """A matching line as it may be shown: printable characters only, cut."""
    clean = "".join(c if c.isprintable() else " " for c in line[: SHOWN_MAX * 2]).strip()
    return clean[:SHOWN_MAX]


def _hits(sig: Signature, line: str, folded: str | None) -> bool:
    if sig.needles:
        hay = folded if sig.folded and folded is not None else line
        if not any(n in hay for n in sig.needles):
            return False
    return sig.regex.search(line) is not None


def diagnose(
    text: str,
    table: Sequence[Signature] = BUILTIN,
    *,
    budget_s: float = 0.5,
    clock: Callable[[], float] = time.perf_counter,
) -> Verdict:
    """The best finding in the tail of ``text``: the highest priority; of equal ones,
    the earliest line (the first error is most often the cause, later ones its echo)."""
    ordered = sorted(table, key=lambda s: -s.priority)
    top = ordered[0].priority if ordered else 0
    folds = any(s.folded for s in ordered)
    best: tuple[Signature, str] | None = None
    lines = lines_of(text)
    deadline = clock() + budget_s
    for n, line in enumerate(lines):
        if n and clock() > deadline:
            return Verdict(finding=_finding(best), lines=n, exhausted=True)
        folded = line.casefold() if folds else None
        for sig in ordered:
            if best is not None and sig.priority <= best[0].priority:
                break
            if _hits(sig, line, folded):
                best = (sig, line)
                break
        if best is not None and best[0].priority >= top:
            return Verdict(finding=_finding(best), lines=n + 1)
    return Verdict(finding=_finding(best), lines=len(lines))


def _finding(best: tuple[Signature, str] | None) -> Finding | None:
    if best is None:
        return None
    sig, line = best
    return Finding(
        signature=sig.id,
        diagnosis=sig.diagnosis,
        hint=sig.hint,
        blame=sig.blame,
        priority=sig.priority,
        line=shown(line),
    )


# -- operators' rules ----------------------------------------------------------------------------


class RulesError(Exception):
    """The rules file as a whole cannot be read (missing, too big, not TOML)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleFile:
    signatures: tuple[Signature, ...]
    skipped: tuple[str, ...]
    """One sentence per entry left out: which, and why."""


def parse_rules(text: str) -> RuleFile:
    """The signatures of a rules file's text; raises ``RulesError`` if it is no TOML."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"not TOML: {exc}") from None
    entries = doc.get("signature", [])
    if not isinstance(entries, list):
        raise RulesError("'signature' must be an array of tables ([[signature]])")
    out: list[Signature] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for n, entry in enumerate(entries, 1):
        name = entry.get("id") if isinstance(entry, dict) else None
        where = f"signature {n}" + (f" ({name!r})" if isinstance(name, str) else "")
        if n > RULES_MAX_ENTRIES:
            skipped.append(f"{where}: more than {RULES_MAX_ENTRIES} signatures")
            continue
        why = _entry_problem(entry, seen)
        sig = compile_signature(**entry) if why is None else why
        if isinstance(sig, str):
            skipped.append(f"{where}: {sig}")
            continue
        seen.add(sig.id)
        out.append(sig)
    return RuleFile(signatures=tuple(out), skipped=tuple(skipped))


def _entry_problem(entry: object, seen: set[str]) -> str | None:
    if not isinstance(entry, dict):
        return "not a table"
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        return f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})"
    missing = sorted({"id", "pattern", "diagnosis"} - set(entry))
    if missing:
        return f"missing {', '.join(missing)}"
    if entry["id"] in seen:
        return f"id {entry['id']!r} given twice"
    return None


def load_rules(path: Path) -> RuleFile:
    """Read a rules file (at most ``RULES_MAX_BYTES``); raises ``RulesError``."""
    try:
        with open(path, "rb") as f:
            raw = f.read(RULES_MAX_BYTES + 1)
    except OSError as exc:
        raise RulesError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > RULES_MAX_BYTES:
        raise RulesError(f"{path} is larger than {RULES_MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RulesError(f"{path} is not UTF-8") from None
    return parse_rules(text)


def table(extra: Iterable[Signature] = ()) -> tuple[Signature, ...]:
    """The built-ins with the operator's signatures added (one of a built-in's id
    replaces it), highest priority first."""
    mine = {s.id: s for s in extra}
    merged = [mine.pop(s.id, s) for s in BUILTIN] + list(mine.values())
    return tuple(sorted(merged, key=lambda s: -s.priority))


__all__ = [
    "BLAMES",
    "BUILTIN",
    "Blame",
    "Finding",
    "RuleFile",
    "RulesError",
    "Signature",
    "Verdict",
    "compile_signature",
    "diagnose",
    "load_rules",
    "needles_of",
    "parse_rules",
    "table",
]
