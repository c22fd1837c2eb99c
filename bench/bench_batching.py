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

``--text``: what continuous batching buys text generation (``/v1/completions``) over
static batching, on the same load (issue 30). Each mode's server differs only in
``--batching``; the simulated step costs ``--step-ms`` plus ``--per-seq-us`` a sequence
in the batch (``gpufleet.modelserver.engine``: a GPU's decoding step grows little with
the batch), at most ``--max-num-seqs`` sequences. Requests (not streamed) ask for
``max_tokens`` drawn uniformly from ``--min-tokens``..``--max-tokens``, Poisson arrivals
at rates climbing x``--factor`` a level, the same seeded loads for both modes. A level
passes with every request answered and p99 latency (from the scheduled send to the last
byte) under ``--p99-bound-s`` (default: 3x the longest request's time alone, so the
bound is about queueing, not length); a mode's figure is the rate served at its last
level that passed, the table the medians over ``--runs`` and the median ratio
continuous/static of requests/s:

    .venv/bin/python bench/bench_batching.py --text [--runs 3] [--seconds 12]
    .venv/bin/python bench/bench_batching.py --text --quick
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from gpufleet.loadgen import LoadShape, Report, Target, kserve_body, percentile, run_load, schedule

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
    ap.add_argument("--seconds", type=float, default=None, help="per level (3; --text: 12)")
    ap.add_argument("--p99-bound-ms", type=float, default=50.0)
    ap.add_argument("--launch-overhead-us", type=float, default=2000.0)
    ap.add_argument("--delay-us", type=int, default=2000, help="batching on: --max-queue-delay-us")
    ap.add_argument("--preferred", default="16,32", help="batching on: --preferred-batch-size")
    ap.add_argument("--start-qps", type=float, default=100.0)
    ap.add_argument("--factor", type=float, default=1.25, help="each level's rate over the last")
    ap.add_argument("--max-qps", type=float, default=5000.0)
    ap.add_argument("--retries", type=int, default=1, help="measures of a failed level before it counts")
    ap.add_argument("--quick", action="store_true", help="--runs 1 --seconds 1.5 --factor 1.5 (--text: 8 s)")
    text = ap.add_argument_group("--text: continuous against static batching of text generation")
    text.add_argument("--text", action="store_true", help="measure text generation, not infer")
    text.add_argument("--step-ms", type=float, default=2.0, help="a decoding step's fixed cost")
    text.add_argument("--per-seq-us", type=float, default=20.0, help="what each sequence adds to a step")
    text.add_argument("--max-num-seqs", type=int, default=32, help="the batch's most sequences")
    text.add_argument("--min-tokens", type=int, default=16)
    text.add_argument("--max-tokens", type=int, default=512)
    text.add_argument("--text-start-qps", type=float, default=8.0)
    text.add_argument("--text-max-qps", type=float, default=400.0)
    text.add_argument("--p99-bound-s", type=float, default=None, help="default: 3x the longest request alone")
    args = ap.parse_args()
    if args.text:
        args.seconds = 12.0 if args.seconds is None else args.seconds
        text_main(args)
        return
    args.seconds = 3.0 if args.seconds is None else args.seconds
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
        shown = "1.00" if mode == "off" else f"{statistics.median(ratios):.2f}"
        figures = f"{med(mode, 'qps'):>18.0f}{med(mode, 'achieved'):>10.1f}{med(mode, 'p50_ms'):>8.2f}"
        figures += f"{med(mode, 'p99_ms'):>8.2f}{med(mode, 'mean_batch'):>10.1f}{shown:>7}"
        print(f"{labels[mode]:<28}{figures}")
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
    print(f"\ngoal: >= {GOAL_RATIO:g}x requests/s at the same p99 bound: {ratio:.2f}x ({verdict})")


# --- text generation: continuous against static batching (issue 30) --------------------------

TEXT_GOAL_RATIO = 1.3
"""Continuous batching's requests/s at the p99 bound over static batching's: the field
reports' "+30 %"."""


@dataclass(frozen=True)
class TextLevel:
    qps: float
    sent: int
    ok: int
    errors: int
    req_s: float
    tok_s: float
    p50_s: float
    p99_s: float

    def passed(self, bound_s: float) -> bool:
        return self.errors == 0 and self.ok == self.sent and self.p99_s <= bound_s


def text_load(qps: float, seconds: float, seed: int, lo: int, hi: int) -> list[tuple[float, int]]:
    """(send time, max_tokens) of every request: Poisson arrivals, output lengths uniform
    in ``lo..hi``; the same seed gives both modes the same load."""
    rng = random.Random(seed)
    return [(at, rng.randint(lo, hi)) for at in schedule(LoadShape(qps=qps, duration_s=seconds), seed=seed)]


async def text_level(port: int, load: list[tuple[float, int]], qps: float, seconds: float) -> TextLevel:
    """Send ``load`` open loop (latency from each request's scheduled time, so queueing
    shows), not streamed; throughput: what was answered over the level's time (the rate
    served, when the level passes: every request answered within the bound)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    tokens = 0
    errors = 0
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        t0 = loop.time()

        async def one(k: int, at: float, max_tokens: int) -> None:
            nonlocal tokens, errors
            body = {"model": "mlp", "prompt": f"request {k}", "max_tokens": max_tokens}
            try:
                async with session.post(url, json=body) as resp:
                    doc = await resp.json(content_type=None)
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            now = loop.time()
            if ok:
                latencies.append(now - (t0 + at))
                tokens += int(doc["usage"]["completion_tokens"])
            else:
                errors += 1

        tasks = []
        for k, (at, max_tokens) in enumerate(load):
            wait = t0 + at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(loop.create_task(one(k, at, max_tokens)))
        await asyncio.gather(*tasks)
    lat = sorted(latencies)
    return TextLevel(
        qps=qps,
        sent=len(load),
        ok=len(lat),
        errors=errors,
        req_s=len(lat) / seconds,
        tok_s=tokens / seconds,
        p50_s=percentile(lat, 0.5) or float("inf"),
        p99_s=percentile(lat, 0.99) or float("inf"),
    )


def text_climb(ports: dict[str, int], args: argparse.Namespace, run: int) -> dict[str, list[TextLevel]]:
    """Rates from ``--text-start-qps``, x``--factor`` a level; at each level every mode
    still climbing is measured on the same load (seeded by run and level), their order
    alternating, so a burst of another process on the machine falls on both alike. A
    failed level is measured ``--retries`` more times before it counts; a mode stops at
    its first failed level, the climb when every mode has stopped."""
    out: dict[str, list[TextLevel]] = {m: [] for m in ports}
    climbing = list(ports)
    qps = args.text_start_qps
    i = 0
    while climbing and qps <= args.text_max_qps:
        order = climbing if (run + i) % 2 == 0 else list(reversed(climbing))
        for mode in order:
            for attempt in range(1 + args.retries):
                seed = 1000 * run + 10 * i + attempt
                load = text_load(qps, args.seconds, seed, args.min_tokens, args.max_tokens)
                level = _run_text(text_level(ports[mode], load, qps, args.seconds))
                print(
                    f"  {mode:<10} {qps:6.1f}/s  sent {level.sent:4d}  {level.req_s:6.1f} req/s"
                    f"  {level.tok_s:7.0f} tok/s  p50 {level.p50_s:6.2f} s  p99 {level.p99_s:6.2f} s"
                    f"  errors {level.errors}",
                    file=sys.stderr,
                    flush=True,
                )
                if level.passed(args.p99_bound_s):
                    break
            out[mode].append(level)
            if not level.passed(args.p99_bound_s):
                climbing.remove(mode)
        qps *= args.factor
        i += 1
    return out


def _run_text(coro: Coroutine[Any, Any, TextLevel]) -> TextLevel:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def text_main(args: argparse.Namespace) -> None:
    """Continuous against static batching: two servers, the same flags but
    ``--batching``, the same loads (``text_climb``)."""
    if args.quick:
        args.runs, args.seconds, args.factor = 1, 8.0, 1.5
    if args.p99_bound_s is None:  # 3x the longest request alone: queueing, not its length
        args.p99_bound_s = 3 * args.max_tokens * (args.step_ms / 1000 + args.per_seq_us / 1e6)
    flags = ["--token-delay-ms", str(args.step_ms), "--token-delay-per-seq-us", str(args.per_seq_us)]
    flags += ["--max-num-seqs", str(args.max_num_seqs), "--max-waiting", "100000", "--no-access-log"]
    modes = ("static", "continuous")
    results: dict[str, list[list[TextLevel]]] = {m: [] for m in modes}
    t0 = time.monotonic()
    for run in range(args.runs):
        print(f"run {run + 1}", file=sys.stderr, flush=True)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ports = {}
            for mode in modes:
                ports[mode] = _port()
                procs.append(start_server(ports[mode], [*flags, "--batching", mode], args.launch_overhead_us))
            for mode, levels in text_climb(ports, args, run).items():
                results[mode].append(levels)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(15)
    text_report(results, args, time.monotonic() - t0)


def text_report(
    results: dict[str, list[list[TextLevel]]], args: argparse.Namespace, elapsed_s: float
) -> None:
    bound = args.p99_bound_s

    def top(levels: list[TextLevel]) -> TextLevel | None:
        passed = [lv for lv in levels if lv.passed(bound)]
        return passed[-1] if passed else None

    tops = {m: [top(r) for r in runs] for m, runs in results.items()}

    def med(mode: str, attr: str) -> float:
        return statistics.median([getattr(lv, attr) if lv else 0.0 for lv in tops[mode]])

    ratios = [
        (c.req_s if c else 0.0) / s.req_s
        for c, s in zip(tops["continuous"], tops["static"], strict=True)
        if s is not None
    ]
    ratio = statistics.median(ratios) if ratios else float("nan")
    print(
        f"\nmodel server text generation: a step costs {args.step_ms:g} ms + {args.per_seq_us:g} us a"
        f" sequence, at most {args.max_num_seqs} sequences; max_tokens uniform {args.min_tokens}-"
        f"{args.max_tokens}, not streamed; open-loop Poisson, {args.seconds:g} s a level, x{args.factor:g}"
        f" per level; p99 bound {bound:.2f} s; median of {args.runs} run(s), {elapsed_s:.0f} s in all\n"
    )
    header = (
        f"{'batching':<12}{'offered/s':>10}{'req/s':>8}{'tok/s':>9}{'p50 s':>8}{'p99 s':>8}{'x static':>10}"
    )
    print(header)
    print("-" * len(header))
    for mode in ("static", "continuous"):
        shown = "1.00" if mode == "static" else f"{ratio:.2f}"
        print(
            f"{mode:<12}{med(mode, 'qps'):>10.1f}{med(mode, 'req_s'):>8.1f}{med(mode, 'tok_s'):>9.0f}"
            f"{med(mode, 'p50_s'):>8.2f}{med(mode, 'p99_s'):>8.2f}{shown:>10}"
        )
    verdict = "met" if ratio >= TEXT_GOAL_RATIO else "NOT met"
    shown = ", ".join(f"{r:.2f}" for r in ratios)
    left = len(tops["static"]) - len(ratios)
    print(
        f"\nper-run ratios: {shown or '-'}"
        + (f" ({left} run(s) where static passed no level)" if left else "")
    )
    print(f"goal: >= {TEXT_GOAL_RATIO:g}x requests/s at the same p99 bound: {ratio:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
