"""What a trace is like, printed beside the results so nobody reads a replay wrongly.

- *Peak weekly offered load*: the mean offered load over the whole trace hides the weeks
  that decide a policy's fate (a month at 0.85 can hold three weeks at 1.2-1.3, when
  queues grow whatever the policy). Each full week from the first submit: GPU-hours
  submitted that week / the fleet's GPU-hours in a week.
- *Right-censoring*: a trace cut at its end records jobs still running then with the end
  of the trace as their end, and a trace whose durations were capped (a site's maximum
  run time, a processing step) piles them at the cap. Both shorten the long jobs a
  policy is judged on. Warned, not corrected: the data cannot say how long those jobs
  would have run.
- *Policies that need what the trace lacks*: ``sjf`` orders by the time limit, so on a
  trace without limits every job counts as the same default and it is FIFO with skipping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.sim.trace import TraceJob, gpu_weight
from gpufleet.timefmt import format_duration

WEEK_S = 7 * 86_400.0
PILE_TOLERANCE_S = 60.0
"""Ends (or durations) within this of the latest count as piled at it."""
PILE_SHARE = 0.001
"""Warn when at least this share of the jobs (and at least ``PILE_MIN_JOBS``) pile up:
uncensored traces spread their last ends and longest durations apart (the Philly slice:
one job ends within an hour of the last end; the synthetic traces' clip at 14 days holds
2 of 20,000 jobs), while a cut trace leaves every job running at the cut there."""
PILE_MIN_JOBS = 5


def weekly_loads(jobs: Sequence[TraceJob], fleet_gpus: int, *, shares: bool = False) -> list[float]:
    """The offered load of each week from the first submit to the last. A last, partial
    week counts over its own length when it is at least half a week long and is left out
    otherwise (a few days' submits say little about a week); a trace shorter than a week
    gives the load over its span, like ``trace.offered_load``."""
    if not jobs or fleet_gpus <= 0:
        return []
    first = min(j.submit_s for j in jobs)
    span = max(j.submit_s for j in jobs) - first
    full = int(span // WEEK_S)
    if full == 0:
        work = sum(gpu_weight(j, shares=shares) * j.duration_s for j in jobs)
        return [work / (fleet_gpus * span)] if span > 0 else []
    rest = span - full * WEEK_S
    lengths = [WEEK_S] * full + ([rest] if rest >= WEEK_S / 2 else [])
    demand = [0.0] * len(lengths)
    for j in jobs:
        week = int((j.submit_s - first) // WEEK_S)
        if week < len(lengths):
            demand[week] += gpu_weight(j, shares=shares) * j.duration_s
    return [d / (fleet_gpus * length) for d, length in zip(demand, lengths, strict=True)]


def censoring_warnings(jobs: Sequence[TraceJob]) -> list[str]:
    """Why the trace looks right-censored, one sentence each; empty when it does not."""
    if not jobs:
        return []
    n = len(jobs)
    enough = max(PILE_MIN_JOBS, PILE_SHARE * n)
    out: list[str] = []
    ends = [j.submit_s + j.duration_s for j in jobs]
    last_end = max(ends)
    at_end = sum(1 for e in ends if e >= last_end - PILE_TOLERANCE_S)
    if at_end >= enough:
        out.append(
            f"{at_end} jobs ({at_end / n:.1%}) end within {PILE_TOLERANCE_S:g} s of the trace's last end: "
            "they look like jobs still running when the trace was cut, shorter here than they ran"
        )
    longest = max(j.duration_s for j in jobs)
    capped = sum(1 for j in jobs if j.duration_s >= longest - PILE_TOLERANCE_S)
    if capped >= enough:
        out.append(
            f"{capped} jobs ({capped / n:.1%}) last {format_duration(longest)}, the longest duration: "
            "durations look capped there, so long jobs are shorter here than they ran"
        )
    return out


def policy_notes(
    jobs: Sequence[TraceJob], policies: Sequence[str], *, default_limit_s: float
) -> dict[str, str]:
    """What a policy cannot use in this trace, by policy name (``sjf``: the limits)."""
    if "sjf" not in policies or not jobs:
        return {}
    without = sum(1 for j in jobs if j.time_limit_s is None)
    if without == len(jobs):
        return {
            "sjf": "no job has a time limit, so sjf (shortest limit first) counts every job as "
            f"{format_duration(default_limit_s)} (--default-time-limit): it is FIFO with skipping here"
        }
    if without:
        return {
            "sjf": f"{without} of {len(jobs)} jobs have no time limit; sjf counts them as "
            f"{format_duration(default_limit_s)} (--default-time-limit)"
        }
    return {}


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceFacts:
    """What ``gpufleet simulate`` says about the trace before the results."""

    weekly_loads: tuple[float, ...]
    """Per week (``weekly_loads``; the whole span of a trace shorter than a week: ``full_weeks``
    False)."""
    full_weeks: bool
    warnings: tuple[str, ...]
    notes: dict[str, str]

    @property
    def peak_week(self) -> int | None:
        loads = self.weekly_loads
        return max(range(len(loads)), key=loads.__getitem__) if loads else None

    def as_dict(self) -> dict[str, object]:
        peak = self.peak_week
        return {
            "weekly_loads": [round(w, 4) for w in self.weekly_loads],
            "peak_weekly_load": None if peak is None else round(self.weekly_loads[peak], 4),
            "peak_week": peak,
            "warnings": list(self.warnings),
            "notes": dict(self.notes),
            "lines": self.lines(),
        }

    def lines(self) -> list[str]:
        """As the CLI and the report print them."""
        out: list[str] = []
        peak = self.peak_week
        if peak is not None:
            loads = self.weekly_loads
            if self.full_weeks:
                every = ", ".join(f"{w:.2f}" for w in loads)
                out.append(
                    f"peak weekly offered load {loads[peak]:.2f} (week {peak + 1} of {len(loads)}: {every})"
                )
            else:
                out.append(f"peak weekly offered load {loads[peak]:.2f} (the trace spans less than a week)")
        out += [f"warning: the trace looks right-censored: {w}" for w in self.warnings]
        out += [f"note: {text}" for text in self.notes.values()]
        return out


def trace_facts(
    jobs: Sequence[TraceJob],
    fleet_gpus: int,
    policies: Sequence[str],
    *,
    shares: bool = False,
    default_limit_s: float,
) -> TraceFacts:
    span = max((j.submit_s for j in jobs), default=0.0) - min((j.submit_s for j in jobs), default=0.0)
    return TraceFacts(
        weekly_loads=tuple(weekly_loads(jobs, fleet_gpus, shares=shares)),
        full_weeks=span >= WEEK_S,
        warnings=tuple(censoring_warnings(jobs)),
        notes=policy_notes(jobs, policies, default_limit_s=default_limit_s),
    )
