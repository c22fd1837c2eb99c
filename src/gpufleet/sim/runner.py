"""Run several policies over one trace and summarise them in one JSON-able dict."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.scheduler import Fleet, Reservation, admit_reservation, make_policy
from gpufleet.scheduler.policies.base import Policy
from gpufleet.sim.config import FleetSpec, SimConfig, SimResult
from gpufleet.sim.engine import Simulator
from gpufleet.sim.loaders.reservations import ReservationRequest
from gpufleet.sim.trace import TraceJob, is_fractional, offered_load
from gpufleet.sim.tracecheck import trace_facts
from gpufleet.timefmt import format_duration


def admit_reservations(
    fleet: Fleet, requests: Sequence[ReservationRequest]
) -> tuple[list[Reservation], list[tuple[str, str]]]:
    """Admit a reservation list in order, as the server would: each one only if its GPUs
    can be guaranteed given the ones admitted before it."""
    accepted: list[Reservation] = []
    rejected: list[tuple[str, str]] = []
    for req in requests:
        start, end = req.start_s, req.start_s + req.duration_s
        got = admit_reservation(
            fleet, accepted, gpus=req.gpus, gpus_per_node=req.gpus_per_node, gpu_type=req.gpu_type,
            start=start, end=end,
        )  # fmt: skip
        if isinstance(got, str):
            rejected.append((req.id, got))
        else:
            accepted.append(
                Reservation(id=req.id, start=start, end=end, nodes=got, users=req.users, team=req.team)
            )
    return accepted, rejected


def bounds(jobs: Sequence[TraceJob], fleet_gpus: int) -> dict[str, float]:
    """What no policy can beat: every job starting on arrival (mean JCT = mean
    duration), and utilisation if the fleet were busy from first submit to the later
    of the last possible finish and the time to do all the work. A fractional job counts
    a whole GPU: on shared GPUs it occupies at most one, so the bound holds there too."""
    if not jobs:
        return {"avg_jct_lower_s": 0.0, "utilization_upper": 0.0}
    first = min(j.submit_s for j in jobs)
    span = max(j.submit_s + j.duration_s for j in jobs) - first
    work = sum(j.duration_s * j.gpus for j in jobs)
    makespan_lower = max(span, work / fleet_gpus)
    return {
        "avg_jct_lower_s": sum(j.duration_s for j in jobs) / len(jobs),
        "utilization_upper": min(1.0, work / (fleet_gpus * makespan_lower)) if makespan_lower > 0 else 0.0,
    }


def _bind(progress: Callable[[str, int], None] | None, name: str) -> Callable[[int], None] | None:
    if progress is None:
        return None
    report = progress
    return lambda n: report(name, n)


def capacity_title(summary: dict[str, Any]) -> str:
    """One line on the fleet's shared GPUs and the trace's fractional jobs."""
    fleet = summary["fleet"]
    how = "ask for shares" if fleet["shared_gpus"] else "take whole GPUs"
    return (
        f"GPU capacity: {fleet['shared_gpus']} of {fleet['gpus']} GPUs shared; "
        f"{summary['fractional_jobs']} fractional jobs {how}"
    )


def capacity_cells(c: dict[str, float | None]) -> tuple[str, str, str, str]:
    """``SimResult.capacity`` as the report and the CLI show it: allocated, shared frag,
    unallocated at the first failure, its time; "n/a" for a figure that has no value."""

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    at = c["first_failure_s"]
    return (
        pct(c["allocated_share"]),
        pct(c["shared_fragmentation"]),
        pct(c["unallocated_at_first_failure"]),
        "n/a" if at is None else format_duration(at),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    summary: dict[str, Any]
    results: dict[str, SimResult]


def compare_policies(
    jobs: Sequence[TraceJob],
    fleet: FleetSpec,
    policies: Sequence[str],
    config: SimConfig,
    *,
    policy_params: dict[str, Any] | None = None,
    progress: Callable[[str, int], None] | None = None,
    reservations: Sequence[ReservationRequest] = (),
) -> Comparison:
    built = fleet.build()
    booked, refused = admit_reservations(built, reservations)
    results: dict[str, SimResult] = {}
    for name in policies:
        policy = make_policy(name, **(policy_params or {}))
        sim = Simulator(jobs, built, policy, config, reservations=booked)
        results[name] = sim.run(_bind(progress, name))
    gpus = fleet.nodes * fleet.gpus_per_node
    shares = fleet.shared_gpus > 0
    first = next(iter(results.values()), None)
    limit = (policy_params or {}).get("default_time_limit_s", Policy.default_time_limit_s)
    summary: dict[str, Any] = {
        "jobs": len(jobs),
        "fleet": fleet.describe(),
        "fractional_jobs": sum(1 for j in jobs if is_fractional(j)),
        "offered_load": round(offered_load(jobs, gpus, shares=shares), 4),
        "trace": trace_facts(jobs, gpus, policies, shares=shares, default_limit_s=limit).as_dict(),
        "rejected": len(first.rejected) if first else 0,
        "reservations": {
            "accepted": len(booked),
            "refused": [{"id": rid, "why": why} for rid, why in refused],
            "reserved_gpu_hours": round(sum(r.gpus * (r.end - r.start) for r in booked) / 3600, 2),
        },
        "bounds": bounds([j for j in jobs if first is None or j.job_id not in dict(first.rejected)], gpus),
        "config": {
            "restart_overhead_s": config.restart_overhead_s,
            "checkpoint_interval_s": config.checkpoint_interval_s,
            "predict": config.predict,
            "sched_interval_s": config.sched_interval_s,
            "gpu_failures_per_gpu_day": config.gpu_failures_per_gpu_day,
            "node_failures_per_node_day": config.node_failures_per_node_day,
            "repair_s": config.repair_s,
            "seed": config.seed,
            "quotas": {q.team: {"gpus": q.gpus, "limit": q.limit} for q in config.quotas},
            "holds": {h.team: h.reason for h in config.holds},
        },
        "policies": {name: r.metrics() for name, r in results.items()},
        "capacity": {name: r.capacity() for name, r in results.items()},
        "costs": {name: r.costs() for name, r in results.items()},
        "estimates": {name: r.estimates() for name, r in results.items()},
    }
    return Comparison(summary=summary, results=results)
