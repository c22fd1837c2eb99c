"""The control plane's memory under the demo's load (issue 35: 374-391 MB; target 150 MB).

Runs the real ``gpufleet demo`` (``--nodes`` simulated nodes of 8 H100s, the Philly
replay, the inference service and its gateway; a temp ``--data-dir``) and finds its
``gpufleet server`` process (the API) and that server's scheduling child
(``gpufleet.server.loops.child``). After ``--settle`` seconds it samples both every
``--every`` seconds for ``--seconds``:

- RSS (``/proc/PID/status``), and where ``/proc/PID/smaps_rollup`` exists PSS (shared pages
  split among their users) and USS (private pages: what killing the process gives back),
- *peak*: the highest sample; *steady*: the median of the samples of the last half.

Each cell is the median of ``--runs`` runs (one demo each); ``total`` adds the API and the
child sample by sample. The demo's own process (agents, workload, gateway) is not the
control plane and is not counted. Target: total peak RSS <= 150 MB. With ``--baseline
SRC`` (a ``src`` folder of another tree, e.g. ``git archive HEAD~3 src | tar -x -C /tmp/b``)
each run is also made with that code first (``PYTHONPATH``), and the rows say which.

    flock /tmp/bench.lock .venv/bin/python bench/bench_rss.py [--nodes 50] [--runs 3]
        [--settle 20] [--seconds 60] [--every 0.5] [--baseline /tmp/b/src]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil

KB = 1024
MB = 1024 * 1024


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample(pid: int) -> tuple[int, int, int]:
    """(RSS, PSS, USS) in bytes; PSS and USS are 0 without smaps_rollup."""
    rss = pss = uss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * KB
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key == "Pss":
                pss = int(rest.split()[0]) * KB
            elif key in ("Private_Clean", "Private_Dirty"):
                uss += int(rest.split()[0]) * KB
    return rss, pss, uss


def find(demo: psutil.Process, timeout: float) -> tuple[int, int]:
    """The pids of the demo's server and of that server's scheduling child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            for p in demo.children():
                cmd = p.cmdline()
                if "server" in cmd and "gpufleet" in cmd:
                    for q in p.children():
                        if "gpufleet.server.loops.child" in q.cmdline():
                            return p.pid, q.pid
        time.sleep(0.2)
    raise RuntimeError("no server with a scheduling child under the demo")


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One process's (or the sum's) samples: (rss, pss, uss) each."""

    samples: list[tuple[int, int, int]]

    def peak(self, i: int) -> float:
        return max(s[i] for s in self.samples) / MB

    def steady(self, i: int) -> float:
        half = self.samples[len(self.samples) // 2 :]
        return statistics.median(s[i] for s in half) / MB


def once(args: argparse.Namespace, src: str | None) -> dict[str, Series]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "gpufleet", "demo", "--nodes", str(args.nodes)]
        cmd += ["--port", str(_port()), "--gateway-port", str(_port()), "--data-dir", tmp]
        env = {**os.environ, "PYTHONPATH": src} if src else None
        out = subprocess.DEVNULL
        demo = subprocess.Popen(cmd, env=env, stdin=out, stdout=out, stderr=out)
        try:
            api, child = find(psutil.Process(demo.pid), 60)
            time.sleep(args.settle)
            got: dict[str, list[tuple[int, int, int]]] = {"API": [], "child": [], "total": []}
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                a, c = sample(api), sample(child)
                got["API"].append(a)
                got["child"].append(c)
                got["total"].append((a[0] + c[0], a[1] + c[1], a[2] + c[2]))
                time.sleep(args.every)
        finally:
            demo.send_signal(signal.SIGTERM)  # (SIGINT is ignored under a background shell)
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                demo.kill()
    return {k: Series(samples=v) for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--baseline", metavar="SRC", help="also run this src folder's code (PYTHONPATH)")
    args = ap.parse_args()
    trees = [("before", args.baseline), ("after", None)] if args.baseline else [("", None)]
    runs: dict[str, list[dict[str, Series]]] = {label: [] for label, _ in trees}
    for _ in range(args.runs):  # interleaved: a drift in the machine's load hits both
        for label, src in trees:
            runs[label].append(once(args, src))
    env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "PYTHONMALLOC"}
    print(
        f"machine: {os.cpu_count()} CPUs; gpufleet demo --nodes {args.nodes}; {args.seconds:g} s "
        f"after {args.settle:g} s; median of {args.runs}; env {env or '-'}"
        + (f"; before = {args.baseline}" if args.baseline else "")
    )
    cols = ("process", "RSS peak", "RSS steady", "PSS peak", "PSS steady", "USS peak", "USS steady")
    print(f"{cols[0]:<15}" + "".join(f"{c:>12}" for c in cols[1:]) + "   (MB)")
    peaks: dict[str, float] = {}
    for label, _ in trees:
        for name in ("API", "child", "total"):
            cells = []
            for i in range(3):
                cells.append(statistics.median(r[name].peak(i) for r in runs[label]))
                cells.append(statistics.median(r[name].steady(i) for r in runs[label]))
            print(f"{(name + ' ' + label).strip():<15}" + "".join(f"{v:>12.1f}" for v in cells))
        peaks[label] = statistics.median(r["total"].peak(0) for r in runs[label])
    last = peaks[trees[-1][0]]
    if args.baseline:
        print(f"total peak RSS after/before: {last / peaks['before']:.2f}")
    print(f"target total peak RSS <= 150 MB: {'yes' if last <= 150 else 'NO'} ({last:.0f} MB)")


if __name__ == "__main__":
    main()
