"""What dynamic batching buys ``gpufleet model-server``: the highest request rate whose
p99 latency stays under a bound, batching off against batching on.

Starts the model server (a subprocess, its default simulated GPU: a fixed
``--launch-overhead-us`` per forward call, see ``gpufleet.modelserver.model``) once per
mode and run, and offers it open-loop load with ``gpufleet.loadgen`` (Poisson arrivals,
latency from each request's scheduled time, so queueing shows) at increasing rates,
``--seconds`` each, climbing until a level fails: p99 over ``--p99-bound-ms``, any
error, or less than 90 % of the offered rate answered (a failed level is measured once
more, ``--retries``, before it counts: on a shared machine one other process's burst
ends a climb otherwise). A mode's figure is the last
level that passed; the table shows medians over ``--runs`` (the order of the modes
alternates between runs) and the ratio on/off of the same runs.

* *off*: each request runs alone (``--max-queue-delay-us 0``);
* *on*: ``--max-queue-delay-us`` (default 2000) with ``--preferred-batch-size``
  (default 16,32).

The generator shares the machine's cores with the server, and on a two-core machine the
server's event loop (HTTP and JSON, ~0.3 ms a request) is the limit once batching has
taken the launch cost away; both figures are the same server's with the same client.

    .venv/bin/python bench/bench_batching.py [--runs 2] [--seconds 3] [--p99-bound-ms 50]
    .venv/bin/python bench/bench_batching.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from gpufleet.loadgen import LoadShape, Report, Target, kserve_body, run_load

GOAL_RATIO = 3.0


@dataclass(frozen=True)
class Level:
    qps: float
    achieved: float
    p50_ms: float
    p99_ms: float
    errors: int
    mean_batch: float

    def passed(self, bound_ms: float) -> bool:
        return self.errors == 0 and self.p99_ms <= bound_ms and self.achieved >= 0.9 * self.qps


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, extra: list[str], overhead_us: float) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpufleet", "model-server", "--port", str(port)]
    cmd += ["--launch-overhead-us", str(overhead_us), *extra]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the model server exited ({proc.returncode})")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the model server is not up after 30 s")


def _counts(port: int) -> tuple[int, int]:
    """(inference_count, execution_count) from Triton's statistics."""
    stats = httpx.get(f"http://127.0.0.1:{port}/v2/models/mlp/stats").json()["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def _run(coro: Coroutine[Any, Any, Report]) -> Report:
    runner: Callable[[Coroutine[Any, Any, Report]], Report] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    return runner(coro)


def climb(port: int, levels: list[float], args: argparse.Namespace, run: int) -> list[Level]:
    """Levels from the lowest until one fails (it is the last in the list)."""
    target = Target(
        url=f"http://127.0.0.1:{port}/v2/models/mlp/infer",
        method="POST",
        body=kserve_body(),
        headers={"Content-Type": "application/json"},
        timeout_s=10,
    )
    _run(run_load(target, LoadShape(qps=100, duration_s=1), report_every_s=1))  # warm-up
    out: list[Level] = []
    for i, qps in enumerate(levels):
        for attempt in range(1 + args.retries):
            level = measure(port, target, qps, args.seconds, seed=10_000 * run + 10 * i + attempt)
            if level.passed(args.p99_bound_ms):
                break
        out.append(level)
        if not level.passed(args.p99_bound_ms):
            break
    return out


def measure(port: int, target: Target, qps: float, seconds: float, seed: int) -> Level:
    rows0, execs0 = _counts(port)
    shape = LoadShape(qps=qps, duration_s=seconds)
    s = _run(run_load(target, shape, seed=seed, report_every_s=seconds)).summary
    rows1, execs1 = _counts(port)
    level = Level(
        qps=qps,
        achieved=s.achieved_qps,
        p50_ms=s.p50_ms or float("inf"),
        p99_ms=s.p99_ms or float("inf"),
        errors=sum(s.errors.values()),
        mean_batch=(rows1 - rows0) / max(1, execs1 - execs0),
    )
    print(
        f"  {qps:7.0f}/s  achieved {level.achieved:7.1f}  p50 {level.p50_ms:7.2f}"
        f"  p99 {level.p99_ms:7.2f}  batch {level.mean_batch:5.1f}  errors {level.errors}",
        file=sys.stderr,
        flush=True,
    )
    return level


def best(levels: list[Level], bound_ms: float) -> Level | None:
    passed = [lv for lv in levels if lv.passed(bound_ms)]
    return passed[-1] if passed else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="per level")
    ap.add_argument("--p99-bound-ms", type=float, default=50.0)
    ap.add_argument("--launch-overhead-us", type=float, default=2000.0)
    ap.add_argument("--delay-us", type=int, default=2000, help="batching on: --max-queue-delay-us")
    ap.add_argument("--preferred", default="16,32", help="batching on: --preferred-batch-size")
    ap.add_argument("--start-qps", type=float, default=100.0)
    ap.add_argument("--factor", type=float, default=1.25, help="each level's rate over the last")
    ap.add_argument("--max-qps", type=float, default=5000.0)
    ap.add_argument("--retries", type=int, default=1, help="measures of a failed level before it counts")
    ap.add_argument("--quick", action="store_true", help="--runs 1 --seconds 1.5 --factor 1.5")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.seconds, args.factor = 1, 1.5, 1.5
    levels = []
    qps = args.start_qps
    while qps <= args.max_qps:
        levels.append(round(qps))
        qps *= args.factor
    modes = {
        "off": [],
        "on": ["--max-queue-delay-us", str(args.delay_us), "--preferred-batch-size", args.preferred],
    }
    results: dict[str, list[list[Level]]] = {m: [] for m in modes}
    t0 = time.monotonic()
    for run in range(args.runs):
        order = list(modes) if run % 2 == 0 else list(reversed(modes))
        for mode in order:
            print(f"run {run + 1}: batching {mode}", file=sys.stderr, flush=True)
            port = _port()
            proc = start_server(port, modes[mode], args.launch_overhead_us)
            try:
                results[mode].append(climb(port, levels, args, run))
            finally:
                proc.terminate()
                proc.wait(15)
    report(results, args, time.monotonic() - t0)


def report(results: dict[str, list[list[Level]]], args: argparse.Namespace, elapsed_s: float) -> None:
    bound = args.p99_bound_ms
    tops: dict[str, list[Level | None]] = {m: [best(r, bound) for r in runs] for m, runs in results.items()}

    def med(mode: str, attr: str) -> float:
        vals = [getattr(lv, attr) if lv else 0.0 for lv in tops[mode]]
        return statistics.median(vals)

    ratios = [
        (on.qps if on else 0.0) / off.qps if off else float("nan")
        for on, off in zip(tops["on"], tops["off"], strict=True)
    ]
    print(
        f"\nmodel server, simulated launch {args.launch_overhead_us:g} us per forward call; open-loop Poisson"
        f" load, {args.seconds:g} s a level, x{args.factor:g} per level; p99 bound {bound:g} ms;"
        f" median of {args.runs} run(s), {elapsed_s:.0f} s in all\n"
    )
    header = f"{'batching':<28}{'req/s @ p99<bound':>18}{'achieved':>10}{'p50 ms':>8}{'p99 ms':>8}"
    header += f"{'rows/exec':>10}{'x off':>7}"
    print(header)
    print("-" * len(header))
    labels = {
        "off": "off",
        "on": f"on ({args.delay_us} us, pref {args.preferred})",
    }
    for mode in ("off", "on"):
        ratio = "1.00" if mode == "off" else f"{statistics.median(ratios):.2f}"
        figures = f"{med(mode, 'qps'):>18.0f}{med(mode, 'achieved'):>10.1f}{med(mode, 'p50_ms'):>8.2f}"
        figures += f"{med(mode, 'p99_ms'):>8.2f}{med(mode, 'mean_batch'):>10.1f}{ratio:>7}"
        print(f"{labels[mode]:<28}{figures}")
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
    print(f"\ngoal: >= {GOAL_RATIO:g}x requests/s at the same p99 bound: {ratio:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
