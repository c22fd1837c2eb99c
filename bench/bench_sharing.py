"""GPU sharing: how much of a 400-GPU fleet a fractional workload can use, per placement.

Compares the three policies of ``gpufleet.scheduler.sharing`` (``whole``: no sharing;
``best-fit``: the tightest GPU that fits; ``fgd``: gpufleet's fragmentation-aware
placement, after Weng et al., ATC'23) on a synthetic workload shaped like Alibaba's
GPU-sharing traces (most asks are a fraction of one GPU, some whole GPUs, a few
2/4/8-GPU gangs; ``--mix``), on ``--nodes`` x ``--gpus-per-node`` GPUs:

1. **Unallocated GPUs at the first failure** (FGD's own measure): asks drawn from the
   mix arrive one at a time and stay; at the first ask that fits nowhere, the GPU share
   still free is what fragmentation stranded (lower is better). Median over ``--seeds``.
2. **Mean JCT** (wait + run) of the whole-GPU jobs and of all jobs, with departures: jobs
   arrive in a Poisson stream at ``--load`` of the fleet's capacity, run a lognormal time,
   and wait in one FIFO queue that is tried in order on every arrival and departure
   (later jobs may start ahead of a blocked one: backfill without reservations). This
   queue is the bench's harness around the placement functions, not gpufleet's
   scheduler; the scheduling core gets the shares in a later step of issue 17.

The goal (issue 17): fgd leaves >= 30 % fewer GPUs unallocated than best fit at the
first failure, with no worse mean JCT for whole-GPU jobs. The table prints medians and
the ratios against best fit; a run is deterministic for a seed. On these homogeneous
fleets (one GPU model, one CPU count) best fit, which fills nodes in order, leaves as
little or less unallocated than fgd (README, "Measured"): the paper's gains come with
GPU-model constraints and uneven nodes, which ``--mix`` does not model yet.

    .venv/bin/python bench/bench_sharing.py [--seeds 5] [--nodes 50] [--gpus-per-node 8]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from dataclasses import dataclass

from gpufleet.scheduler.sharing import (
    POLICIES,
    WHOLE,
    Ask,
    Choice,
    Fragmentation,
    Mix,
    Policy,
    Shares,
    give,
    place,
    take,
)

MIXES: dict[str, Mix] = {
    # most asks a fraction of one GPU, many with more CPUs per GPU share than a node has
    # (12 per GPU here), as in Alibaba's cluster-trace-gpu-v2023 (openb) pod lists
    "sharing": (
        (Ask(milli=100, cpus=8), 0.08),
        (Ask(milli=200, cpus=4), 0.08),
        (Ask(milli=250, cpus=8), 0.10),
        (Ask(milli=250, cpus=16), 0.05),
        (Ask(milli=300, cpus=6), 0.06),
        (Ask(milli=500, cpus=12), 0.12),
        (Ask(milli=500, cpus=24), 0.04),
        (Ask(milli=700, cpus=12), 0.05),
        (Ask(gpus=1, cpus=12), 0.26),
        (Ask(gpus=1, cpus=24), 0.04),
        (Ask(gpus=2, cpus=24), 0.06),
        (Ask(gpus=4, cpus=48), 0.04),
        (Ask(gpus=8, cpus=96), 0.02),
    ),
    # the same shares without CPUs (GPU share alone decides)
    "gpu-only": (
        (Ask(milli=100), 0.08),
        (Ask(milli=200), 0.08),
        (Ask(milli=250), 0.15),
        (Ask(milli=300), 0.06),
        (Ask(milli=500), 0.16),
        (Ask(milli=700), 0.05),
        (Ask(gpus=1), 0.30),
        (Ask(gpus=2), 0.06),
        (Ask(gpus=4), 0.04),
        (Ask(gpus=8), 0.02),
    ),
}


def draw(rng: random.Random, mix: Mix) -> Ask:
    asks, weights = zip(*mix, strict=True)
    return rng.choices(asks, weights=weights)[0]


def first_failure(
    policy: Policy, mix: Mix, seed: int, nodes: int, per_node: int, cpus: int
) -> tuple[float, int]:
    """(share of the fleet's GPUs not given to what the asks asked for when the first ask
    fails, asks placed). Under ``whole`` a fraction holding a whole GPU leaves the rest of
    that GPU unallocated to any work, so this counts it too."""
    rng = random.Random(seed)
    shares = Shares.empty(nodes, per_node, cpus)
    frag = Fragmentation(mix=mix)
    placed = asked = 0
    while True:
        ask = draw(rng, mix)
        c = place(shares, ask, policy, frag)
        if c is None:
            return 1 - asked / shares.capacity(), placed
        take(shares, c)
        placed += 1
        asked += ask.share


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    ask: Ask
    arrive: float
    run_s: float


def workload(mix: Mix, seed: int, capacity_gpus: int, load: float, jobs: int) -> list[Job]:
    """Poisson arrivals at ``load`` of the fleet's capacity (by GPU share x time)."""
    rng = random.Random(seed)
    mean_share = sum(a.share * p for a, p in mix) / sum(p for _, p in mix) / WHOLE
    mean_run = math.exp(1.0 + 0.8**2 / 2) * 600.0  # lognormal(1.0, 0.8) x 10 min
    rate = load * capacity_gpus / (mean_share * mean_run)
    t, out = 0.0, []
    for i in range(jobs):
        t += rng.expovariate(rate)
        out.append(Job(id=i, ask=draw(rng, mix), arrive=t, run_s=600.0 * rng.lognormvariate(1.0, 0.8)))
    return out


def jcts(
    policy: Policy, mix: Mix, jobs: list[Job], nodes: int, per_node: int, cpus: int
) -> tuple[float, float]:
    """(mean JCT of the whole-GPU jobs, mean JCT of all), FIFO queue tried in order."""
    shares = Shares.empty(nodes, per_node, cpus)
    frag = Fragmentation(mix=mix)
    queue: list[Job] = []
    ends: list[tuple[float, int, Choice]] = []
    done: dict[int, float] = {}
    nxt = 0
    while nxt < len(jobs) or queue or ends:
        arrive = jobs[nxt].arrive if nxt < len(jobs) else math.inf
        end = ends[0][0] if ends else math.inf
        if arrive <= end:
            now = arrive
            queue.append(jobs[nxt])
            nxt += 1
        else:
            now, _, c = heapq.heappop(ends)
            give(shares, c)
        waiting: list[Job] = []
        for j in queue:
            c = place(shares, j.ask, policy, frag)
            if c is None:
                waiting.append(j)
                continue
            take(shares, c)
            heapq.heappush(ends, (now + j.run_s, j.id, c))
            done[j.id] = now + j.run_s - j.arrive
        queue = waiting
    whole = [done[j.id] for j in jobs if not j.ask.fractional]
    return statistics.fmean(whole), statistics.fmean(done.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--cpus-per-node", type=int, default=96)
    ap.add_argument("--mix", choices=sorted(MIXES), default="sharing")
    ap.add_argument("--load", type=float, default=0.95, help="Offered load of the JCT runs (share x time).")
    ap.add_argument("--jobs", type=int, default=4000, help="Jobs per JCT run.")
    args = ap.parse_args()
    mix = MIXES[args.mix]
    gpus = args.nodes * args.gpus_per_node
    rows: dict[str, dict[str, list[float]]] = {
        p: {"unalloc": [], "placed": [], "wjct": [], "jct": [], "s": []} for p in POLICIES
    }
    for seed in range(args.seeds):
        trace = workload(mix, seed, gpus, args.load, args.jobs)
        for p in POLICIES:
            t0 = time.perf_counter()
            shape = (args.nodes, args.gpus_per_node, args.cpus_per_node)
            unalloc, placed = first_failure(p, mix, seed, *shape)
            wjct, jct = jcts(p, mix, trace, *shape)
            r = rows[p]
            r["unalloc"].append(unalloc)
            r["placed"].append(placed)
            r["wjct"].append(wjct)
            r["jct"].append(jct)
            r["s"].append(time.perf_counter() - t0)
    med = {p: {k: statistics.median(v) for k, v in r.items()} for p, r in rows.items()}
    base = med["best-fit"]
    print(
        f"{gpus} GPUs ({args.nodes} x {args.gpus_per_node}, {args.cpus_per_node} CPUs a node), "
        f"mix {args.mix!r}, median of {args.seeds} seeds; "
        f"JCT runs: {args.jobs} jobs at load {args.load:g}"
    )
    header = [
        "policy",
        "unalloc @1st fail",
        "vs best-fit",
        "asks placed",
        "whole-GPU JCT s",
        "vs best-fit",
        "all JCT s",
        "run s",
    ]
    table = [header]
    for p in POLICIES:
        m = med[p]
        table.append(
            [
                p,
                f"{100 * m['unalloc']:.1f} %",
                f"{m['unalloc'] / base['unalloc']:.2f}x" if base["unalloc"] else "-",
                f"{m['placed']:.0f}",
                f"{m['wjct']:.0f}",
                f"{m['wjct'] / base['wjct']:.2f}x",
                f"{m['jct']:.0f}",
                f"{m['s']:.1f}",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print(
            "  ".join([r[0].ljust(widths[0]), *(v.rjust(w) for v, w in zip(r[1:], widths[1:], strict=True))])
        )
    fewer = 1 - med["fgd"]["unalloc"] / base["unalloc"] if base["unalloc"] else 0.0
    jct_ok = med["fgd"]["wjct"] <= base["wjct"]
    print(
        f"goal: fgd leaves >= 30 % fewer GPUs unallocated than best fit at the first failure: "
        f"{100 * fewer:.0f} % fewer, {'met' if fewer >= 0.30 else 'NOT met'}; whole-GPU JCT no worse: "
        f"{'met' if jct_ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
