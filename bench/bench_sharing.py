"""GPU sharing: how much of a 400-GPU fleet a fractional workload can use, per placement.

Compares the three policies of ``gpufleet.scheduler.sharing`` (``whole``: no sharing;
``best-fit``: the tightest place that fits; ``fgd``: gpufleet's fragmentation-aware
placement, after Weng et al., ATC'23) on 400 GPUs.

Fleets (``--fleet``):

- ``openb`` (default): the make-up of the Alibaba GPU cluster behind the paper's traces
  (``cluster-trace-gpu-v2023/openb_node_list_gpu_node``: 1,213 nodes, 6,212 GPUs, 17.2
  CPUs a GPU) scaled to 400 GPUs: 8-GPU nodes with 96 or 128 CPUs (G2, G3, V100M32),
  2-GPU T4 nodes with 104 CPUs, 2-GPU P100 nodes with 16, 4-GPU V100M16 nodes with 32;
- ``uniform``: 50 x 8 GPUs with 96 CPUs each (12 a GPU), the bench's first fleet.

Mixes of asks (``--mix``), drawn by popularity:

- ``sharing`` (default, the issue's workload): 58 % fractions of a GPU, 30 % one GPU, 12 %
  2/4/8-GPU gangs, with 15.7 CPUs asked a GPU: more than the 12 a GPU of 8-GPU nodes
  with 96 CPUs, so on ``uniform`` CPUs run out first whatever the placement (``bound``);
- ``openb``: the kinds of the paper's default trace (``openb_pod_list_default``, 8,152
  tasks: the kinds of >= 0.5 % of them and every gang kind, by task count): 38 %
  fractions (a third of them 0.81 GPU with 3 CPUs), 48 % one GPU with 3-24 CPUs, 1 %
  gangs, 13 % CPU-only tasks;
- ``gpu-only``: ``sharing``'s shares without CPUs.

``--gpuspec 0.33`` binds that share of the GPU asks to GPU models, as
``openb_pod_list_gpuspec33`` does (T4, P100, G2, G3, V100; ``--fleet openb`` only; an
ask is bound only to models whose empty nodes could host it). At 400 GPUs the pools are
small (16 P100 GPUs with 128 CPUs), so one of them runs out within the first hundred
asks under every policy: read the 100 % column there.

Measured (median over ``--seeds``, ratios against best fit, run in the same script):

1. **Unallocated GPUs at the first failure** (the issue's headline): asks drawn from the
   mix arrive one at a time and stay; at the first ask that fits nowhere, the share of
   the fleet's GPUs not given to what the asks asked for (lower is better).
2. **Unallocated at 100 % asked** (the paper's figures): the same stream goes on, asks
   that fit nowhere are dropped, until the GPU share asked reaches the fleet's capacity.
3. **Mean JCT** (wait + run) of the whole-GPU jobs, of the gangs (2+ GPUs) and of all:
   jobs arrive in a Poisson stream at ``--load`` of the fleet's GPU capacity, run a
   lognormal time, and wait in one FIFO queue tried in order whenever a job ends (later
   jobs may start ahead of a blocked one: backfill without reservations). This queue is
   the bench's harness around the placement functions, not gpufleet's scheduler.

``bound`` is a floor no placement can beat at the first failure: the share unallocated
when the asks so far first exceed the fleet's CPUs, or its GPUs counting each fraction
over half a GPU as taking a GPU of its own (smaller fractions filling what they leave).
``--explain`` prints, per seed and policy, the ask that failed first and where the free
GPU share lay for it (on nodes without the CPUs for it, of another model, on partly used
GPUs, untouched on nodes with too few untouched GPUs for a gang).

The goal (issue 17): fgd leaves >= 30 % fewer GPUs unallocated than best fit at the
first failure, with no worse mean JCT for whole-GPU jobs. A run is deterministic.

    .venv/bin/python bench/bench_sharing.py [--seeds 5] [--fleet openb] [--mix sharing] [--explain]
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
    admits,
    give,
    place,
    take,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeKind:
    count: int
    gpus: int
    cpus: int
    model: str


FLEETS: dict[str, tuple[NodeKind, ...]] = {
    "openb": (
        NodeKind(count=35, gpus=8, cpus=96, model="G2"),
        NodeKind(count=26, gpus=2, cpus=104, model="T4"),
        NodeKind(count=8, gpus=2, cpus=16, model="P100"),
        NodeKind(count=3, gpus=8, cpus=128, model="G3"),
        NodeKind(count=2, gpus=8, cpus=96, model="V100M32"),
        NodeKind(count=3, gpus=4, cpus=32, model="V100M16"),
    ),
    "uniform": (NodeKind(count=50, gpus=8, cpus=96, model="G2"),),
}


def _ask(gpus: int, milli: int, cpus: int) -> Ask:
    return Ask(gpus=gpus, milli=milli, cpus=cpus)


MIXES: dict[str, Mix] = {
    # most asks a fraction of one GPU, many with more CPUs per GPU share than an 8-GPU
    # node with 96 CPUs has (12 per GPU)
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
    # openb_pod_list_default: (GPUs, thousandths of each, CPUs) of the kinds of >= 0.5 %
    # of the tasks and of every gang kind (8-GPU ones with 88 or 120 CPUs as 88; 2-GPU
    # ones at their median 16), weighted by task count; 0 GPUs: CPU-only tasks
    "openb": (
        (_ask(1, 810, 3), 1047),
        (_ask(1, 470, 12), 388),
        (_ask(1, 470, 8), 360),
        (_ask(1, 650, 12), 237),
        (_ask(1, 320, 4), 232),
        (_ask(1, 230, 4), 122),
        (_ask(1, 460, 6), 120),
        (_ask(1, 590, 3), 75),
        (_ask(1, 320, 8), 72),
        (_ask(1, 550, 4), 72),
        (_ask(1, 160, 4), 54),
        (_ask(1, 370, 4), 45),
        (_ask(1, 220, 4), 43),
        (_ask(1, WHOLE, 11), 1473),
        (_ask(1, WHOLE, 12), 535),
        (_ask(1, WHOLE, 3), 470),
        (_ask(1, WHOLE, 16), 338),
        (_ask(1, WHOLE, 19), 255),
        (_ask(1, WHOLE, 8), 205),
        (_ask(1, WHOLE, 10), 195),
        (_ask(1, WHOLE, 4), 159),
        (_ask(1, WHOLE, 14), 94),
        (_ask(1, WHOLE, 24), 84),
        (_ask(1, WHOLE, 15), 53),
        (_ask(2, WHOLE, 16), 16),
        (_ask(4, WHOLE, 32), 15),
        (_ask(8, WHOLE, 64), 21),
        (_ask(8, WHOLE, 88), 23),
        (_ask(0, WHOLE, 12), 370),
        (_ask(0, WHOLE, 32), 290),
        (_ask(0, WHOLE, 8), 185),
        (_ask(0, WHOLE, 15), 120),
        (_ask(0, WHOLE, 16), 109),
    ),
}

GPUSPEC33: dict[str, tuple[tuple[str, float], ...]] = {
    # openb_pod_list_gpuspec33: of each class of GPU ask, the share bound to these models
    "fraction": (("T4", 0.19), ("P100", 0.09)),
    "one": (
        ("T4", 0.18),
        ("G2", 0.08),
        ("V100M16|V100M32", 0.04),
        ("P100|V100M16|V100M32", 0.03),
        ("G3", 0.02),
    ),
    "gang": (("G2", 0.13), ("V100M16|V100M32", 0.09), ("G3", 0.08)),
}


def with_models(mix: Mix, gpuspec: float, fleet_name: str) -> Mix:
    """``mix`` with ``gpuspec`` of its GPU asks bound to GPU models as in gpuspec33, where
    an empty node of those models could host the ask (else it stays unbound)."""
    scale = gpuspec / 0.33
    out: list[tuple[Ask, float]] = []
    for a, p in mix:
        rest = p
        if not a.cpu_only and scale > 0:
            kind = "fraction" if a.fractional else "one" if a.gpus == 1 else "gang"
            for models, share in GPUSPEC33[kind]:
                bound = Ask(gpus=a.gpus, milli=a.milli, cpus=a.cpus, models=frozenset(models.split("|")))
                if any(
                    k.model in bound.models and k.gpus >= a.gpus and k.cpus >= a.cpus
                    for k in FLEETS[fleet_name]
                ):
                    out.append((bound, p * share * scale))
                    rest -= p * share * scale
        out.append((a, rest))
    return tuple(out)


def fleet(name: str) -> Shares:
    nodes = [k for k in FLEETS[name] for _ in range(k.count)]
    return Shares(
        names=[f"{k.model.lower()}-{i:03d}" for i, k in enumerate(nodes)],
        free=[[WHOLE] * k.gpus for k in nodes],
        cpus=[k.cpus for k in nodes],
        models=[k.model for k in nodes],
    )


def draw(rng: random.Random, mix: Mix) -> Ask:
    return rng.choices([a for a, _ in mix], weights=[p for _, p in mix])[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    unalloc: float
    placed: int
    ask: Ask
    stranded: dict[str, float]


def stranded(shares: Shares, ask: Ask) -> dict[str, float]:
    """Where the free GPU share lies for ``ask`` (in GPUs): on nodes without the CPUs for
    it, of another model, on partly used GPUs it cannot use, untouched on nodes with too
    few untouched GPUs for it."""
    out = {"no CPUs": 0.0, "model": 0.0, "partial": 0.0, "<k untouched": 0.0}
    for n, free in enumerate(shares.free):
        cpus = shares.cpus_left(n)
        if cpus is not None and cpus < ask.cpus:
            out["no CPUs"] += sum(free) / WHOLE
        elif not admits(None, shares.model(n), ask):
            out["model"] += sum(free) / WHOLE
        else:
            out["partial"] += sum(f for f in free if f < WHOLE and f < max(ask.milli, 1)) / WHOLE
            if not ask.fractional and sum(1 for f in free if f == WHOLE) < ask.gpus:
                out["<k untouched"] += sum(f for f in free if f == WHOLE) / WHOLE
    return out


def first_failure(policy: Policy, mix: Mix, seed: int, fleet_name: str) -> Failure:
    """Asks arrive and stay until one fits nowhere. Under ``whole`` a fraction holding a
    whole GPU leaves the rest of it unallocated to any work, so this counts it too."""
    rng = random.Random(seed)
    shares = fleet(fleet_name)
    frag = Fragmentation(mix=mix)
    placed = asked = 0
    while True:
        ask = draw(rng, mix)
        c = place(shares, ask, policy, frag)
        if c is None:
            return Failure(
                unalloc=1 - asked / shares.capacity(), placed=placed, ask=ask, stranded=stranded(shares, ask)
            )
        take(shares, c)
        placed += 1
        asked += ask.share


def at_capacity(policy: Policy, mix: Mix, seed: int, fleet_name: str) -> float:
    """The paper's measure: the same stream goes on past failures (dropped) until the GPU
    share asked reaches the fleet's capacity; the share then unallocated to the asks."""
    rng = random.Random(seed)
    shares = fleet(fleet_name)
    frag = Fragmentation(mix=mix)
    asked = placed = 0
    while asked < shares.capacity():
        ask = draw(rng, mix)
        asked += ask.share
        c = place(shares, ask, policy, frag)
        if c is not None:
            take(shares, c)
            placed += ask.share
    return 1 - placed / shares.capacity()


def bound(mix: Mix, seed: int, fleet_name: str) -> float:
    """Unallocated when the stream's asks first cannot fit in any placement: CPUs over the
    fleet's, or GPUs over its count with each fraction over half a GPU on its own GPU."""
    rng = random.Random(seed)
    shares = fleet(fleet_name)
    cpus, gpus = sum(shares.cpus), shares.capacity() // WHOLE
    asked = cpus_asked = big = small = beside = whole = 0
    while True:
        ask = draw(rng, mix)
        if ask.fractional and 2 * ask.milli > WHOLE:
            big, beside = big + 1, beside + WHOLE - ask.milli
        elif ask.fractional:
            small += ask.milli
        else:
            whole += ask.gpus
        cpus_asked += ask.cpus
        if cpus_asked > cpus or WHOLE * (whole + big) + max(0, small - beside) > WHOLE * gpus:
            return 1 - asked / shares.capacity()
        asked += ask.share


@dataclass(frozen=True, slots=True, kw_only=True)
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
        run_s = 600.0 * rng.lognormvariate(1.0, 0.8)
        out.append(Job(id=i, ask=draw(rng, mix), arrive=t, run_s=run_s))
    return out


def jcts(policy: Policy, mix: Mix, jobs: list[Job], fleet_name: str) -> tuple[float, float, float]:
    """(mean JCT of the whole-GPU jobs, of the gangs, of all), FIFO queue tried in order.
    Only an end makes room, so an arrival tries only itself; and within one pass an ask
    that failed fails again (the pass only takes), so it is not placed twice."""
    shares = fleet(fleet_name)
    frag = Fragmentation(mix=mix)
    queue: list[Job] = []
    ends: list[tuple[float, int, Choice]] = []
    done: dict[int, float] = {}
    nxt = 0
    while nxt < len(jobs) or ends:
        arrive = jobs[nxt].arrive if nxt < len(jobs) else math.inf
        end = ends[0][0] if ends else math.inf
        if arrive <= end:
            now, tried = arrive, [jobs[nxt]]
            nxt += 1
        else:
            now, _, c = heapq.heappop(ends)
            give(shares, c)
            tried, queue = queue, []
        failed: set[Ask] = set()
        for j in tried:
            got = None if j.ask in failed else place(shares, j.ask, policy, frag)
            if got is None:
                failed.add(j.ask)
                queue.append(j)
                continue
            take(shares, got)
            heapq.heappush(ends, (now + j.run_s, j.id, got))
            done[j.id] = now + j.run_s - j.arrive
    if queue:  # they fit no node even when all is free
        raise ValueError(f"{len(queue)} jobs fit nowhere on fleet {fleet_name!r}, e.g. {queue[0].ask}")
    whole = [done[j.id] for j in jobs if j.ask.gpus and not j.ask.fractional]
    gangs = [done[j.id] for j in jobs if j.ask.gpus > 1]
    return (
        statistics.fmean(whole),
        statistics.fmean(gangs) if gangs else math.nan,
        statistics.fmean(done.values()),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--fleet", choices=sorted(FLEETS), default="openb")
    ap.add_argument("--mix", choices=sorted(MIXES), default="sharing")
    ap.add_argument("--gpuspec", type=float, default=0.0, help="Share of GPU asks bound to GPU models.")
    ap.add_argument("--load", type=float, default=0.95, help="Offered load of the JCT runs (share x time).")
    ap.add_argument("--jobs", type=int, default=4000, help="Jobs per JCT run.")
    ap.add_argument("--explain", action="store_true", help="Print each seed's first failure.")
    args = ap.parse_args()
    models = {k.model for k in FLEETS[args.fleet]}
    named = {m for specs in GPUSPEC33.values() for ms, _ in specs for m in ms.split("|")}
    if args.gpuspec and not named <= models:
        ap.error(f"--gpuspec binds asks to {sorted(named)}; fleet {args.fleet!r} has {sorted(models)}")
    mix = with_models(MIXES[args.mix], args.gpuspec, args.fleet)
    gpus = fleet(args.fleet).capacity() // WHOLE
    keys = ("unalloc", "cap", "placed", "wjct", "gjct", "jct", "s")
    rows: dict[str, dict[str, list[float]]] = {p: {k: [] for k in keys} for p in POLICIES}
    floors: list[float] = []
    for seed in range(args.seeds):
        floors.append(bound(mix, seed, args.fleet))
        trace = workload(mix, seed, gpus, args.load, args.jobs)
        for p in POLICIES:
            t0 = time.perf_counter()
            f = first_failure(p, mix, seed, args.fleet)
            r = rows[p]
            r["unalloc"].append(f.unalloc)
            r["placed"].append(f.placed)
            r["cap"].append(at_capacity(p, mix, seed, args.fleet))
            wjct, gjct, jct = jcts(p, mix, trace, args.fleet)
            r["wjct"].append(wjct)
            r["gjct"].append(gjct)
            r["jct"].append(jct)
            r["s"].append(time.perf_counter() - t0)
            if args.explain:
                where = ", ".join(f"{k} {v:.1f}" for k, v in f.stranded.items() if v)
                print(
                    f"seed {seed} {p:8} {100 * f.unalloc:5.1f} % unallocated when ask {f.placed + 1} "
                    f"failed: {_name(f.ask)}; free GPUs for it: {where or 'none'}"
                )
    med = {p: {k: statistics.median(v) for k, v in r.items()} for p, r in rows.items()}
    base = med["best-fit"]
    spec = f", {args.gpuspec:g} of GPU asks bound to models" if args.gpuspec else ""
    print(
        f"{gpus} GPUs (fleet {args.fleet!r}), mix {args.mix!r}{spec}, median of {args.seeds} seeds; "
        f"JCT runs: {args.jobs} jobs at load {args.load:g}"
    )
    header = [
        "policy",
        "unalloc @1st fail",
        "vs best-fit",
        "unalloc @100% asked",
        "vs best-fit",
        "asks placed",
        "whole-GPU JCT s",
        "vs best-fit",
        "gang JCT s",
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
                _ratio(m["unalloc"], base["unalloc"]),
                f"{100 * m['cap']:.1f} %",
                _ratio(m["cap"], base["cap"]),
                f"{m['placed']:.0f}",
                f"{m['wjct']:.0f}",
                _ratio(m["wjct"], base["wjct"]),
                f"{m['gjct']:.0f}",
                f"{m['jct']:.0f}",
                f"{m['s']:.1f}",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for line in table:
        cells = [line[0].ljust(widths[0]), *(v.rjust(w) for v, w in zip(line[1:], widths[1:], strict=True))]
        print("  ".join(cells))
    print(
        f"bound: no placement leaves less than {100 * statistics.median(floors):.1f} % unallocated at the "
        f"first failure here (asks then exceed the fleet's CPUs or GPUs)"
    )
    fewer = 1 - med["fgd"]["unalloc"] / base["unalloc"] if base["unalloc"] else 0.0
    jct_ok = med["fgd"]["wjct"] <= base["wjct"]
    print(
        f"goal: fgd leaves >= 30 % fewer GPUs unallocated than best fit at the first failure: "
        f"{100 * fewer:.0f} % fewer, {'met' if fewer >= 0.30 else 'NOT met'}; whole-GPU JCT no worse: "
        f"{'met' if jct_ok else 'NOT met'} ({_ratio(med['fgd']['wjct'], base['wjct'])})"
    )


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base else "-"


def _name(a: Ask) -> str:
    what = "CPUs only" if a.cpu_only else f"{a.milli / WHOLE:g} GPU" if a.fractional else f"{a.gpus} GPU"
    models = f" on {'|'.join(sorted(a.models))}" if a.models else ""
    return f"{what}, {a.cpus} CPUs{models}"


if __name__ == "__main__":
    main()
