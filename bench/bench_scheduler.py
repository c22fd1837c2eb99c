"""One scheduling pass on a big fleet: how long, and how it grows with the queue.

Fleet: 1,000 nodes x 8 H100 (16 nodes per leaf, 4 leaves per rack), 90% of GPUs busy
with running jobs of mixed widths; N pending jobs (70% 1-GPU, then 2/4/8/16/32-GPU
gangs) with time limits. Each pass runs with ``explain=True`` (positions, estimated
starts and reasons for every pending job) and ``pause_gc=True``, as the server's loop
calls it, with one ``PlanCache`` kept across the passes of a row (as a scheduling loop
keeps one; a fresh policy object each pass, so waiting jobs' keys are computed every
time). ``--no-cache``: every pass rebuilds everything (``cache=None``).
``--gc-on``: the collector is left alone during passes (``pause_gc=False``).

Prints the median of --runs passes per (policy, N) and the ratio to the N=1,000 run of
the same policy (linear growth would be 10x at 10k and 50x at 50k).

    python bench/bench_scheduler.py [--runs 5] [--pending 1000,10000,50000] [--no-cache] [--gc-on]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpufleet.scheduler import (
    Fleet,
    Gpu,
    JobRequest,
    Node,
    NodeGpus,
    PlanCache,
    RunningJob,
    Snapshot,
    make_policy,
    plan,
)

SIZES = [1] * 70 + [2] * 10 + [4] * 8 + [8] * 8 + [16] * 3 + [32] * 1


def build(nodes: int, pending: int, seed: int = 0) -> Snapshot:
    rng = random.Random(seed)
    gpus = tuple(Gpu(index=i, model="H100-80GB") for i in range(8))
    fleet = Fleet(
        nodes=tuple(
            Node(name=f"n{i:04d}", gpus=gpus, leaf=f"leaf-{i // 16}", rack=f"rack-{i // 64}")
            for i in range(nodes)
        )
    )
    running: list[RunningJob] = []
    free = {n.name: list(range(8)) for n in fleet.nodes}
    target = int(nodes * 8 * 0.9)
    used = 0
    names = [n.name for n in fleet.nodes]
    while used < target:
        width = rng.choice([1, 1, 1, 2, 4, 8])
        node = rng.choice(names)
        if len(free[node]) < width:
            continue
        take = tuple(free[node][:width])
        del free[node][:width]
        used += width
        job = JobRequest(
            id=f"r{len(running)}", gpus=width, submit_time=0.0, team=f"t{rng.randrange(6)}",
            time_limit_s=rng.choice([3600.0, 4 * 3600.0, 24 * 3600.0]),
        )  # fmt: skip
        running.append(
            RunningJob(job=job, placement=(NodeGpus(node=node, gpus=take),), started_at=rng.uniform(0, 3600))
        )
    queue = tuple(
        JobRequest(
            id=f"p{i}",
            gpus=rng.choice(SIZES),
            submit_time=3600.0 + i,
            team=f"t{rng.randrange(6)}",
            user=f"u{rng.randrange(50)}",
            time_limit_s=rng.choice([None, 1800.0, 3600.0, 8 * 3600.0]),
            attained_service_s=rng.choice([0.0, 0.0, 0.0, 5000.0, 50_000.0]),
        )
        for i in range(pending)
    )
    return Snapshot(now=7200.0, fleet=fleet, running=tuple(running), pending=queue)


def median_ms(snap: Snapshot, policy: str, runs: int, *, cached: bool, pause_gc: bool) -> tuple[float, int]:
    times = []
    starts = 0
    cache = PlanCache() if cached else None
    for _ in range(runs):
        t0 = time.perf_counter()
        p = plan(snap, make_policy(policy), cache=cache, pause_gc=pause_gc)
        times.append((time.perf_counter() - t0) * 1000)
        starts = len(p.starts)
    return statistics.median(times), starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pending", default="1000,10000,50000")
    ap.add_argument("--policies", default="default,backfill,fifo,las,fairshare")
    ap.add_argument("--no-cache", action="store_true", help="cache=None: every pass rebuilds everything")
    ap.add_argument("--gc-on", action="store_true", help="pause_gc=False: the collector left on in passes")
    args = ap.parse_args()
    sizes = [int(x) for x in args.pending.split(",")]
    print(
        f"fleet: {args.nodes} nodes x 8 GPUs, 90% busy; median of {args.runs} passes, explain=True, "
        f"{'no cache' if args.no_cache else 'one PlanCache per row'}"
        f"{', collector on' if args.gc_on else ', gc paused in passes'}"
    )
    header = ("policy", "pending", "median ms", "us/job", "x vs 1st", "linear", "starts")
    print("{:<10} {:>8} {:>10} {:>8} {:>9} {:>7} {:>7}".format(*header))
    for policy in args.policies.split(","):
        base = None
        for n in sizes:
            snap = build(args.nodes, n)
            ms, starts = median_ms(snap, policy, args.runs, cached=not args.no_cache, pause_gc=not args.gc_on)
            base = base or ms
            print(
                f"{policy:<10} {n:>8} {ms:>10.1f} {ms * 1000 / n:>8.1f} {ms / base:>9.2f} "
                f"{n / sizes[0]:>7.1f} {starts:>7}",
                flush=True,
            )


if __name__ == "__main__":
    main()
