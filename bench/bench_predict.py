"""What predicted run times buy (issue 33): policies x fleet sizes on one trace, with the
lost-work model on (jobs checkpoint every 30 min; a preempted one loses the rest).

Each row is one replay (the simulator is deterministic: the same trace, fleet and
policy give the same figures, so there is nothing to take a median of). The trace is
the Philly CSV (``--trace``, ``--format philly``) or ``gpufleet trace synth`` made in
memory (``--synth JOBS``). ``default/no-predict`` is ``default`` with no predictions
(``SimConfig.predict=False``: the policy before issue 33 saw none); every other policy
runs with them, as the server does (only ``default`` reads them; ``las`` and
``srtf-oracle`` are the baseline and the bound).

Columns: mean JCT, p99 queueing delay, GPU-hours lost to preemption, the median
relative error of the estimated start a job's owner read at submit (|estimate - start| /
wait, ``sim/estimates.py``; with ``--estimates``, slower), and mean JCT against ``las``
and ``srtf-oracle`` of the same fleet.

    python bench/bench_predict.py --trace /work/shared/traces/philly/philly-2017-09-18_2017-10-31.csv \\
        --format philly --nodes 60,70 [--max-jobs N] [--estimates]
    python bench/bench_predict.py --synth 20000 --nodes 40 --load 1.2 [--starve-gap 0]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpufleet.sim import FleetSpec, SimConfig, offered_load
from gpufleet.sim.loaders import load_trace
from gpufleet.sim.runner import compare_policies
from gpufleet.sim.synth import synthesize
from gpufleet.sim.trace import TraceJob

NO_PREDICT = "default/no-predict"


def replay(
    jobs: list[TraceJob], nodes: int, policy: str, config: SimConfig, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    name = "default" if policy == NO_PREDICT else policy
    cfg = replace(config, predict=policy != NO_PREDICT)
    t0 = time.perf_counter()
    mine = params if name == "default" else None  # ``DefaultPolicy``'s fields
    summary = compare_policies(jobs, FleetSpec(nodes=nodes), [name], cfg, policy_params=mine).summary
    est = summary["estimates"][name]
    return {
        **summary["policies"][name],
        "lost_gpu_h": summary["costs"][name]["lost_gpu_h_preemption"],
        "est_rel": None if est is None else est["median_rel_error"],
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--format", default="philly")
    ap.add_argument("--synth", type=int, default=0, help="a synthetic trace of this many jobs instead")
    ap.add_argument(
        "--load", type=float, default=0.9, help="the synthetic trace's offered load (on --nodes' first)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", default="60,70")
    ap.add_argument("--max-jobs", type=int, default=0)
    ap.add_argument("--policies", default=f"las,{NO_PREDICT},default,srtf-oracle")
    ap.add_argument("--estimates", action="store_true", help="measure the estimated starts too (slower)")
    ap.add_argument(
        "--starve-gap",
        type=float,
        default=None,
        help="default's starve_gap (levels; default -inf: a starving job preempts any non-starving one)",
    )
    args = ap.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    if args.synth:
        jobs = synthesize(jobs=args.synth, seed=args.seed, load=args.load, nodes=sizes[0])
        source = f"trace synth --jobs {args.synth} --seed {args.seed} --load {args.load} --nodes {sizes[0]}"
    else:
        if args.trace is None:
            ap.error("give --trace FILE or --synth JOBS")
        jobs = load_trace(args.trace, args.format).jobs
        source = str(args.trace)
    if args.max_jobs:
        jobs = jobs[: args.max_jobs]
    config = SimConfig(estimate_starts=args.estimates)  # checkpoint every 30 min, 60 s restarts
    policies = args.policies.split(",")
    gap = "" if args.starve_gap is None else f"; default's starve_gap {args.starve_gap:g}"
    print(f"trace: {source}, {len(jobs)} jobs; lost-work model on (checkpoint every 30 min){gap}")
    head = (
        f"{'nodes':>5} {'load':>5} {'policy':<20} {'mean JCT h':>10} {'p99 queue h':>11} {'lost GPU-h':>10} "
        f"{'est err p50':>11} {'x las':>6} {'x oracle':>8} {'sim s':>6}"
    )
    print(head)
    for nodes in sizes:
        params = None if args.starve_gap is None else {"starve_gap": args.starve_gap}
        rows = {p: replay(jobs, nodes, p, config, params) for p in policies}
        load = offered_load(jobs, nodes * 8)
        las = rows.get("las", {}).get("avg_jct_s")
        oracle = rows.get("srtf-oracle", {}).get("avg_jct_s")
        for p, m in rows.items():
            jct = m["avg_jct_s"]
            est = "-" if m["est_rel"] is None else f"{m['est_rel']:.0%}"
            print(
                f"{nodes:>5} {load:>5.2f} {p:<20} {jct / 3600:>10.2f} {m['p99_queue_s'] / 3600:>11.2f} "
                f"{m['lost_gpu_h']:>10,.0f} {est:>11} "
                f"{(f'{jct / las:.2f}' if las else '-'):>6} {(f'{jct / oracle:.2f}' if oracle else '-'):>8} "
                f"{m['wall_s']:>6.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
