"""Rack power budgets in a replay: a slice of the Philly trace on the full 50 x 8 H100
fleet (5 racks of 10 nodes), once without budgets and once with every rack's feed set
(``--rack-kw``, ``--headroom``). Prints each rack's peak estimated draw (taken after
every scheduling pass, recomputed here from the running jobs, not read from the core)
against its cap, and what the budget costs in mean JCT and queueing.

The draw model is ``scheduler/powermodel.py``'s: an H100 SXM at 700 W busy, 70 W idle,
1.5 kW a node besides its GPUs, so a rack of 10 nodes draws 20.6 kW idle and 71 kW with
every GPU busy. The default budget, 80 kW less 30 % headroom (56 kW), powers 56 of a
rack's 80 GPUs at once.

    python bench/bench_power.py [--jobs 3000] [--rack-kw 80] [--headroom 0.3] [--policy backfill]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpufleet.scheduler import Fleet, make_policy
from gpufleet.scheduler.powermodel import PowerModel, RackBudget, board_power_w, default_base_w
from gpufleet.sim import FleetSpec, SimConfig, Simulator
from gpufleet.sim.config import SimResult
from gpufleet.sim.loaders import load_trace

TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly" / "philly-2017-09-18_2017-10-31.csv"
)


class PeakDraw:
    """Each rack's estimated draw after every pass, from the simulator's running jobs."""

    def __init__(self, fleet: Fleet, idle_fraction: float) -> None:
        self.rack_of = {n.name: n.rack for n in fleet.nodes}
        self.busy_w = {n.name: board_power_w(n.model) for n in fleet.nodes}
        self.idle: dict[str, float] = {}
        for n in fleet.nodes:
            w = default_base_w(len(n.gpus)) + len(n.gpus) * idle_fraction * self.busy_w[n.name]
            self.idle[n.rack] = self.idle.get(n.rack, 0.0) + w
        self.idle_fraction = idle_fraction
        self.peak = dict(self.idle)

    def observe(self, sim: Simulator) -> None:
        draw = dict(self.idle)
        for rj in sim.running_jobs.values():
            for part in rj.placement:
                w = self.busy_w[part.node]
                draw[self.rack_of[part.node]] += len(part.gpus) * w * (1 - self.idle_fraction)
        for rack, w in draw.items():
            self.peak[rack] = max(self.peak[rack], w)


def replay(jobs: list, fleet: Fleet, policy: str, power: PowerModel | None) -> tuple[SimResult, PeakDraw]:
    sim = Simulator(jobs, fleet, make_policy(policy), SimConfig(sched_interval_s=10.0, power=power))
    peaks = PeakDraw(fleet, power.idle_fraction if power else 0.1)
    schedule_pass = sim.schedule_pass

    def observed() -> None:
        schedule_pass()
        peaks.observe(sim)

    sim.schedule_pass = observed  # type: ignore[method-assign]
    return sim.run(), peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=3000, help="the trace's first N jobs")
    ap.add_argument("--rack-kw", default="80,100", help="budgets to replay, kW a rack, comma-separated")
    ap.add_argument("--headroom", type=float, default=0.3)
    ap.add_argument("--policy", default="backfill")
    args = ap.parse_args()
    fleet = FleetSpec(nodes=50, gpus_per_node=8, gpu_model="NVIDIA H100 80GB HBM3").build()
    jobs = load_trace(TRACE, "philly").jobs[: args.jobs]
    racks = sorted({n.rack for n in fleet.nodes})
    print(
        f"trace: first {len(jobs)} Philly jobs; fleet 50 x 8 H100, {len(racks)} racks of 10 nodes; "
        f"policy {args.policy}; headroom {args.headroom:.0%}"
    )
    runs: list[tuple[str, PowerModel | None]] = [("none", None)]
    for kw in (float(x) for x in args.rack_kw.split(",")):
        budgets = tuple(RackBudget(rack=r, budget_w=kw * 1000, headroom=args.headroom) for r in racks)
        runs.append((f"{kw:g} kW", PowerModel(racks=budgets)))
    print(
        f"{'budget':<8} {'cap kW':>7} {'peak kW (max rack)':>19} {'within':>7} {'done':>5} "
        f"{'mean JCT h':>11} {'vs none':>8} {'mean queue h':>13} {'passes':>7} {'wall s':>7}"
    )
    base: float | None = None
    over: list[str] = []
    for name, power in runs:
        t0 = time.perf_counter()
        res, peaks = replay(jobs, fleet, args.policy, power)
        wall = time.perf_counter() - t0
        m = res.metrics()
        base = base or m["avg_jct_s"]
        cap = power.racks[0].cap_w if power else float("inf")
        peak = max(peaks.peak.values())
        within = peak <= cap + 1e-6
        if not within:
            over.append(name)
        print(
            f"{name:<8} {cap / 1000:>7.1f} {peak / 1000:>19.1f} {within!s:>7} {len(res.outcomes):>5} "
            f"{m['avg_jct_s'] / 3600:>11.2f} {m['avg_jct_s'] / base - 1:>+8.1%} "
            f"{m['avg_queue_s'] / 3600:>13.2f} {res.passes:>7} {wall:>7.1f}"
        )
    if over:
        raise SystemExit(f"a rack went over its cap: {over}")


if __name__ == "__main__":
    main()
