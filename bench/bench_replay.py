"""Replay a 100,000-job synthetic trace on the 400-GPU reference fleet.

Trace: ``gpufleet trace synth --jobs 100000 --seed 1 --load 0.9`` (50 nodes x 8 GPUs),
generated in memory. Prints, per policy, the median wall time of --runs replays and its
ratio to the first policy listed (the baseline, run in the same process on the same
trace). ``fifo`` makes a poor baseline here: its strict order builds queues of thousands,
which makes every pass long.

    python bench/bench_replay.py [--jobs 100000] [--runs 3] [--policies las,default]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpufleet.scheduler import make_policy
from gpufleet.sim import FleetSpec, SimConfig, Simulator, offered_load
from gpufleet.sim.synth import synthesize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policies", default="las,default")
    args = ap.parse_args()
    spec = FleetSpec(nodes=50, gpus_per_node=8)
    t0 = time.perf_counter()
    jobs = synthesize(jobs=args.jobs, seed=1, load=0.9, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node)
    print(
        f"trace: {len(jobs)} jobs, offered load {offered_load(jobs, 400):.2f} on 50x8 GPUs "
        f"(generated in {time.perf_counter() - t0:.1f} s); median of {args.runs} replays"
    )
    print(
        f"{'policy':<10} {'median s':>9} {'x first':>8} {'passes':>8} {'avg JCT h':>10} {'p99 queue h':>12}"
    )
    base: float | None = None
    for name in args.policies.split(","):
        walls = []
        result = None
        for _ in range(args.runs):
            sim = Simulator(
                jobs, spec.build(), make_policy(name), SimConfig(sched_interval_s=10.0)
            )  # the README's figures: the 10 s model
            result = sim.run()
            walls.append(result.wall_s)
        assert result is not None
        wall = statistics.median(walls)
        base = base or wall
        m = result.metrics()
        print(
            f"{name:<10} {wall:>9.1f} {wall / base:>8.2f} {result.passes:>8} "
            f"{m['avg_jct_s'] / 3600:>10.2f} {m['p99_queue_s'] / 3600:>12.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
