"""Job dependencies, Slurm's ``--dependency`` (``sbatch(1)``), parsed and judged the same
way by the server and the simulator. Pure: the caller says what it knows of each job.

Grammar: ``TYPE:ID[:ID...]`` items joined by ``,`` (all must hold) or by ``?`` (any
may), never both; ``singleton`` alone as an item. ``ID`` is a job id, or ``A_T`` (task
``T`` of array ``A``); a bare array id stands for every task of that array.

========== ================================================ ===========================
type       satisfied when every job named ...               never satisfied when ...
========== ================================================ ===========================
after      has started (or ended: a job cancelled before     (never: it can still start)
           it started counts, as in Slurm)
afterany   has ended, however                               (never)
afterok    has ended COMPLETED (exit 0)                     one ended otherwise
afternotok has ended FAILED, TIMEOUT or CANCELLED           one ended COMPLETED
singleton  no earlier job (lower id) of the same user and   (never)
           name is still waiting or running
========== ================================================ ===========================

Refused (a ``DependencyError`` with the words to show): unknown types, ``+time`` delays,
``afterburstbuffer``/``aftercorr`` (gpufleet cannot honour them with their meaning),
mixing ``,`` and ``?``, an empty or malformed id. Whether a named job exists and may be
depended on is the caller's question (the server: the submitter's own jobs only).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

KINDS = ("after", "afterany", "afterok", "afternotok")
MAX_ID = 2**31 - 1
_ID = re.compile(r"^(\d+)(?:_(\d+))?$")


class DependencyError(ValueError):
    """A dependency gpufleet cannot take; the message says why and what to do."""


class Phase(enum.Enum):
    """What the judge needs to know of a job."""

    WAITING = "waiting"  # pending, held, or requeued: not started (this attempt)
    STARTED = "started"  # scheduled or running
    OK = "ok"  # COMPLETED
    NOT_OK = "not_ok"  # FAILED, TIMEOUT, CANCELLED


ENDED = (Phase.OK, Phase.NOT_OK)


@dataclass(frozen=True, slots=True)
class Ref:
    """A job, or a task of an array (``task`` set), or a whole array (``job`` is the
    array's id and the caller expands it)."""

    job: int
    task: int | None = None

    def __str__(self) -> str:
        return str(self.job) if self.task is None else f"{self.job}_{self.task}"


@dataclass(frozen=True, slots=True)
class Item:
    kind: str  # one of KINDS, or "singleton"
    refs: tuple[Ref, ...] = ()

    def __str__(self) -> str:
        return self.kind if not self.refs else f"{self.kind}:{':'.join(map(str, self.refs))}"


@dataclass(frozen=True, slots=True)
class Dependency:
    items: tuple[Item, ...]
    any_of: bool = False  # joined by "?" (else ",": all)

    def __str__(self) -> str:
        return ("?" if self.any_of else ",").join(map(str, self.items))

    @property
    def refs(self) -> tuple[Ref, ...]:
        return tuple(r for it in self.items for r in it.refs)

    @property
    def singleton(self) -> bool:
        return any(it.kind == "singleton" for it in self.items)


def parse(text: str) -> Dependency:
    text = text.strip()
    if not text:
        raise DependencyError("--dependency: empty; expected e.g. afterok:123 or afterok:123:124,after:99")
    if "," in text and "?" in text:
        raise DependencyError(f"--dependency={text}: use ',' (all) or '?' (any), not both")
    any_of = "?" in text
    items = []
    for raw in text.split("?" if any_of else ","):
        kind, _, ids = raw.strip().partition(":")
        kind = kind.strip().lower()
        if kind == "singleton":
            if ids:
                raise DependencyError(f"--dependency={text}: singleton takes no job ids")
            items.append(Item("singleton"))
            continue
        if kind in ("afterburstbuffer", "aftercorr"):
            raise DependencyError(
                f"--dependency={text}: {kind} is not supported (gpufleet has no burst buffers and "
                "no task-by-task array correlation); use afterok or afterany"
            )
        if kind not in KINDS:
            raise DependencyError(
                f"--dependency={text}: unknown type {kind!r}; one of {', '.join(KINDS)}, singleton"
            )
        if not ids:
            raise DependencyError(f"--dependency={text}: {kind} needs job ids ({kind}:123[:124...])")
        refs = []
        for part in ids.split(":"):
            part = part.strip()
            if "+" in part:
                raise DependencyError(
                    f"--dependency={text}: a delay (+minutes) is not supported; use --begin for a start time"
                )
            m = _ID.match(part)
            if m is None or any((g is not None and len(g) > 10) or int(g or 0) > MAX_ID for g in m.groups()):
                raise DependencyError(
                    f"--dependency={text}: {part!r} is not a job id (123, or 123_4 for a task)"
                )
            refs.append(Ref(int(m.group(1)), None if m.group(2) is None else int(m.group(2))))
        items.append(Item(kind, tuple(refs)))
    return Dependency(tuple(items), any_of)


@dataclass(frozen=True, slots=True)
class Verdict:
    satisfied: bool
    never: bool
    waiting_on: tuple[str, ...]
    """Jobs (caller's ids) whose start or end the job waits for (its ETA follows theirs)."""
    detail: str

    @property
    def code(self) -> str:
        """Slurm's reason: ``Dependency`` or ``DependencyNeverSatisfied``."""
        return "DependencyNeverSatisfied" if self.never else "Dependency"


SATISFIED = Verdict(True, False, (), "")

Lookup = Callable[[Ref], Iterable[tuple[str, Phase]]]
"""The jobs a ref stands for (one, or every task of an array) as (id, phase); none: unknown."""


def judge(dep: Dependency, lookup: Lookup, *, singleton_blockers: Iterable[str] = ()) -> Verdict:
    """Whether ``dep`` holds now. ``singleton_blockers``: earlier jobs of the same user
    and name still waiting or running (the caller finds them). An unknown job (purged)
    never satisfies an ``afterok``/``afternotok`` and counts as ended for the rest."""
    results: list[tuple[bool, bool, list[str], str]] = []
    blockers = tuple(singleton_blockers)
    for item in dep.items:
        if item.kind == "singleton":
            ok = not blockers
            results.append((ok, False, list(blockers), "" if ok else f"singleton: job {blockers[0]} first"))
            continue
        ok, never, why = True, False, ""
        waits: list[str] = []
        for ref in item.refs:
            jobs = list(lookup(ref))
            if not jobs:
                if item.kind in ("afterok", "afternotok"):
                    ok, never, why = False, True, f"{item.kind}: job {ref} is unknown"
                continue
            for jid, phase in jobs:
                good, bad = _holds(item.kind, phase)
                if bad:
                    ok, never = False, True
                    how = "COMPLETED" if phase is Phase.OK else "without success"
                    why = f"{item.kind}: job {jid} ended {how}"
                elif not good:
                    ok = False
                    waits.append(jid)
                    why = (
                        why
                        or f"{item.kind}: job {jid} {'not started' if phase is Phase.WAITING else 'running'}"
                    )
        results.append((ok, never, waits, why))
    if dep.any_of:
        if any(ok for ok, _, _, _ in results):
            return SATISFIED
        never = all(nv for _, nv, _, _ in results)
    else:
        if all(ok for ok, _, _, _ in results):
            return SATISFIED
        never = any(nv for _, nv, _, _ in results)
    after = tuple(dict.fromkeys(w for ok, _, ws, _ in results if not ok for w in ws))
    details = [why for ok, nv, _, why in results if not ok and (nv or not never) and why]
    return Verdict(False, never, () if never else after, "; ".join(details[:3]))


def _holds(kind: str, phase: Phase) -> tuple[bool, bool]:
    """(satisfied, never) for one job."""
    if kind == "after":
        return phase is not Phase.WAITING, False
    if kind == "afterany":
        return phase in ENDED, False
    if kind == "afterok":
        return phase is Phase.OK, phase is Phase.NOT_OK
    return phase is Phase.NOT_OK, phase is Phase.OK  # afternotok
