"""Shared parsing helpers for the trace loaders.

A loader reads rows, turns each into a ``TraceJob`` and hands it to a ``TraceBuilder``;
anything wrong with one row is raised as ``BadRow`` and becomes a ``TraceProblem`` for
that line. Only ``TraceError`` (the whole file is unusable) leaves a loader.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from gpufleet.sim.trace import TraceError, TraceJob, TraceLoad, TraceProblem

_EPOCH = datetime(1970, 1, 1)


class BadRow(ValueError):
    """One row cannot be used; the message becomes the row's ``TraceProblem``."""


@contextmanager
def open_trace(path: Path) -> Iterator[TextIO]:
    """Open a trace as UTF-8 text (a leading BOM is dropped) and translate I/O and
    decoding failures, also those raised while reading, into ``TraceError``."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            yield handle
    except FileNotFoundError as exc:
        raise TraceError(f"trace file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace file {path}: {exc}") from exc


def numbered_rows(handle: TextIO, *, delimiter: str = ",") -> Iterator[tuple[int, list[str]]]:
    """CSV records with the 1-based physical line each starts on; blank lines are skipped."""
    reader = csv.reader(handle, delimiter=delimiter)
    start = 1
    for record in reader:
        if record and any(cell.strip() for cell in record):
            yield start, record
        start = reader.line_num + 1


def column_index(header: Sequence[str], *, required: Sequence[str], fmt: str) -> dict[str, int]:
    """Map header names (stripped) to positions; ``TraceError`` when a required one is missing."""
    index = {name.strip(): pos for pos, name in enumerate(header) if name.strip()}
    missing = [name for name in required if name not in index]
    if missing:
        raise TraceError(f"{fmt} header lacks column(s) {', '.join(missing)}: got {list(index)}")
    return index


def as_mapping(record: Sequence[str], index: Mapping[str, int]) -> dict[str, str]:
    """A record as name -> stripped value, for records with exactly the header's width."""
    width = max(index.values()) + 1
    if len(record) < width:
        raise BadRow(f"expected {width} fields, got {len(record)}")
    return {name: record[pos].strip() for name, pos in index.items()}


def text(row: Mapping[str, str], name: str) -> str:
    value = row.get(name, "")
    if not value:
        raise BadRow(f"missing {name}")
    return value


def to_float(value: str, name: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise BadRow(f"{name} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise BadRow(f"{name} is not finite: {value!r}")
    return number


def to_int(value: str, name: str) -> int:
    """An integer; ``"4.0"`` is accepted (several published traces write counts as floats)."""
    number = to_float(value, name)
    if not number.is_integer():
        raise BadRow(f"{name} is not a whole number: {value!r}")
    return int(number)


def to_timestamp(value: str, name: str) -> float:
    """Seconds since 1970 of a naive ISO time (``2017-09-18 02:22:17`` or with ``T``).
    Traces carry local wall-clock times without a zone; they are only ever subtracted."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadRow(f"{name} is not a timestamp: {value!r}") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return (moment - _EPOCH).total_seconds()


@dataclass(slots=True)
class TraceBuilder:
    """Collects jobs and problems; checks what every format must satisfy."""

    source: str
    jobs: list[tuple[int, TraceJob]] = field(default_factory=list)
    problems: list[TraceProblem] = field(default_factory=list)
    _first_line: dict[str, int] = field(default_factory=dict)

    def skip(self, line: int, message: str) -> None:
        self.problems.append(TraceProblem(line, message))

    def add(self, line: int, job: TraceJob) -> None:
        problem = job_problem(job)
        if problem is None and job.job_id in self._first_line:
            problem = f"duplicate job_id {job.job_id!r} (first on line {self._first_line[job.job_id]})"
        if problem is not None:
            self.skip(line, problem)
            return
        self._first_line[job.job_id] = line
        self.jobs.append((line, job))

    def finish(self) -> TraceLoad:
        """Jobs sorted by (submit_s, job_id), rebased so the earliest submit is 0.0."""
        jobs = [job for _, job in self.jobs]
        origin = min((job.submit_s for job in jobs), default=0.0)
        rebased = sorted(
            (replace(job, submit_s=job.submit_s - origin) for job in jobs),
            key=lambda job: (job.submit_s, job.job_id),
        )
        problems = sorted(self.problems, key=lambda problem: problem.line)
        return TraceLoad(jobs=rebased, problems=problems, source=self.source)


def load_with_header(
    path: Path,
    *,
    required: Sequence[str],
    fmt: str,
    expected: str,
    parse: Callable[[dict[str, str]], TraceJob],
) -> TraceLoad:
    """A CSV trace whose first row names its columns (``required`` among them): each
    row ``parse``d into a job, or skipped with its line where ``parse`` raises
    ``BadRow``. ``expected``: what an empty file should have started with."""
    builder = TraceBuilder(source=str(path))
    with open_trace(path) as handle:
        rows = numbered_rows(handle)
        first = next(rows, None)
        if first is None:
            raise TraceError(f"{path}: empty file, expected {expected}")
        index = column_index(first[1], required=required, fmt=fmt)
        for line, record in rows:
            try:
                job = parse(as_mapping(record, index))
            except BadRow as exc:
                builder.skip(line, str(exc))
            else:
                builder.add(line, job)
    return builder.finish()


def job_problem(job: TraceJob) -> str | None:
    """Why a parsed job cannot enter a simulation, or None when it can."""
    if not job.job_id:
        return "missing job_id"
    if job.gpus < 0:
        return f"negative GPU count: {job.gpus}"
    if job.gpus == 0:
        return "no GPUs requested"
    if not math.isfinite(job.submit_s):
        return "submit time is not finite"
    if not math.isfinite(job.duration_s):
        return "duration is not finite"
    if not job.duration_s > 0:
        return f"non-positive duration: {job.duration_s:g}"
    if job.gpus_per_node < 0 or (job.gpus_per_node and job.gpus % job.gpus_per_node):
        return f"gpus_per_node {job.gpus_per_node} does not divide gpus {job.gpus}"
    if job.time_limit_s is not None and not job.time_limit_s > 0:
        return f"non-positive time limit: {job.time_limit_s}"
    return None
