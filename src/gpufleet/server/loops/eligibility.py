"""When a waiting job may start by the clock: ``--begin``, ``--deadline`` and
``--max-price`` (gpufleet's own: wait for an off-peak price, but start in time for the
deadline). Judged each pass, like dependencies (``dependencies.py``); the pass runs
every ``--schedule-interval``, so a begin time or a price window is acted on within one.

- ``begin_at`` in the future: ``BeginTime`` (Slurm's reason), estimated start = then.
- ``deadline``: a job that can no longer end by it (now + its time limit, or now when
  it has none, past the deadline) is cancelled, reason ``Deadline`` (Slurm ends it
  in state DEADLINE; gpufleet's states have CANCELLED with the reason).
- ``max_price``: while a GPU-hour of the job's GPU model (``gpu_type``, else the
  cheapest model of its pool) costs more than that under the price schedule in force
  (its priority's surcharge included), it waits, reason ``Price``, until the first
  moment in the next 8 days when it costs no more (its estimated start); with a
  deadline it starts anyway once waiting longer would miss it. No schedule: free.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufleet.scheduler import Blocked
from gpufleet.server.decide.pricing import PriceSchedule

LOOKAHEAD_S = 8 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Timed:
    """A waiting job with a time rule, as the pass read it."""

    id: int
    begin_at: float | None
    deadline: float | None
    max_price: float | None
    time_limit_s: float | None
    gpu_type: str | None
    pool: str
    priority: int


def _at(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def judge(
    jobs: Sequence[Timed],
    *,
    now: float,
    schedule: PriceSchedule | None,
    pool_models: Mapping[str, Sequence[str]],
) -> tuple[dict[int, Blocked], dict[int, str]]:
    """(jobs held back and why, jobs to cancel and why)."""
    held: dict[int, Blocked] = {}
    cancel: dict[int, str] = {}
    for j in jobs:
        limit = j.time_limit_s or 0.0
        if j.deadline is not None and now + limit > j.deadline:
            cancel[j.id] = f"Deadline: cannot end by {_at(j.deadline)} (time limit {limit:g} s)"
            continue
        if j.begin_at is not None and j.begin_at > now:
            held[j.id] = Blocked(
                code="BeginTime", detail=f"not before {_at(j.begin_at)}", not_before=j.begin_at
            )
            continue
        if j.max_price is None or schedule is None:
            continue
        models = [j.gpu_type] if j.gpu_type else list(pool_models.get(j.pool, ()))
        if not models:
            continue
        cost = min(schedule.price(m, now, priority=j.priority) for m in models)
        if cost <= j.max_price:
            continue
        latest = None if j.deadline is None else j.deadline - limit
        if latest is not None and now >= latest:
            continue  # waiting longer would miss the deadline: start at today's price
        cheap = next(
            (
                b
                for b in schedule.boundaries(now, now + LOOKAHEAD_S)
                if min(schedule.price(m, b, priority=j.priority) for m in models) <= j.max_price
            ),
            None,
        )
        start = cheap if latest is None or (cheap is not None and cheap < latest) else latest
        when = "no cheaper window in the next 8 days" if start is None else f"waits for {_at(start)}"
        detail = f"a GPU-hour costs {cost:.4g} now, max {j.max_price:g}; {when}"
        held[j.id] = Blocked(code="Price", detail=detail, not_before=start)
    return held, cancel
