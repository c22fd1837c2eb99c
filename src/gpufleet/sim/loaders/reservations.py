"""Reservation lists replayed alongside a trace (``gpufleet simulate --reservations``).

CSV with the header ``id,start_s,duration_s,gpus,gpus_per_node,gpu_type,users,team``:
``start_s`` on the trace's clock (seconds from its first submit), ``users`` separated by
``;``, empty ``gpu_type``/``team`` = any/none. Bad rows are reported by line, like traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.sim.loaders._rows import (
    BadRow,
    as_mapping,
    column_index,
    numbered_rows,
    open_trace,
    text,
    to_float,
    to_int,
)
from gpufleet.sim.trace import TraceError, TraceProblem

COLUMNS = ("id", "start_s", "duration_s", "gpus", "gpus_per_node", "gpu_type", "users", "team")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationRequest:
    id: str
    start_s: float
    duration_s: float
    gpus: int
    gpus_per_node: int = 0
    gpu_type: str | None = None
    users: tuple[str, ...] = ()
    team: str | None = None


def load_reservations(path: Path) -> tuple[list[ReservationRequest], list[TraceProblem]]:
    out: list[ReservationRequest] = []
    problems: list[TraceProblem] = []
    with open_trace(path) as handle:
        rows = numbered_rows(handle)
        first = next(rows, None)
        if first is None:
            raise TraceError(f"{path}: empty file, expected the header {','.join(COLUMNS)}")
        index = column_index(first[1], required=COLUMNS[:4], fmt="reservations")
        seen: set[str] = set()
        for line, record in rows:
            try:
                row = as_mapping(record, index)
                req = ReservationRequest(
                    id=text(row, "id"),
                    start_s=to_float(text(row, "start_s"), "start_s"),
                    duration_s=to_float(text(row, "duration_s"), "duration_s"),
                    gpus=to_int(text(row, "gpus"), "gpus"),
                    gpus_per_node=to_int(row.get("gpus_per_node", "") or "0", "gpus_per_node"),
                    gpu_type=row.get("gpu_type", "").strip() or None,
                    users=tuple(u.strip() for u in row.get("users", "").split(";") if u.strip()),
                    team=row.get("team", "").strip() or None,
                )
                if req.duration_s <= 0 or req.gpus <= 0:
                    raise BadRow("duration_s and gpus must be positive")
                if req.id in seen:
                    raise BadRow(f"duplicate reservation id {req.id}")
            except BadRow as exc:
                problems.append(TraceProblem(line, str(exc)))
                continue
            seen.add(req.id)
            out.append(req)
    return out, problems
