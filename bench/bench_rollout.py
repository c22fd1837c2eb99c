"""Rollouts under a constant load, measured: does an update ever fail a request or leave
fewer ready replicas than asked, and does a broken one stall with every old replica
serving (issue 30)?

Real processes, as ``bench_autoscale.py`` (whose ``Fleet`` this uses: a ``gpufleet
server`` on SQLite with ``--service-drain 2s``, ``--nodes`` in-process agents with one
simulated GPU each, a ``gpufleet gateway`` at its default ``--refresh``, ``gpufleet
model-server`` replicas as jobs). The service ``roll`` (3 replicas, ``max_surge`` 1,
``max_unavailable`` 0: the defaults) serves ``--qps`` KServe infer requests per second
through the gateway, evenly spaced, from the first second to the last; every answer that
is not a 200 (a status, a timeout, a refused or reset connection) is a failed request.
A monitor reads ``GET /v1/services/roll`` every 0.1 s: *ready* is its replicas that are
ready, in rotation (not warm) and not draining, whatever their generation.

**good**: ``service update --model-version 2``. Reported: failed requests (goal 0), the
fewest ready replicas seen from the update to the end (goal: never below 3), and the
time from the update until the rollout is ``complete`` (3 ready replicas of generation
2, none older).

**broken**: ``service update --command "sh -c 'exit 3'"`` (a generation that never gets
ready). Reported: the time until the rollout says ``stalled`` (its replicas crash-loop),
failed requests and the fewest ready replicas (goals: 0 and 3, for ``--hold`` seconds
after the stall too), and how many of the ready ones at the end are of generation 1
(goal: all 3).

Each case runs ``--runs`` times on a fresh fleet (the median is reported).

    flock /tmp/bench.lock .venv/bin/python bench/bench_rollout.py [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench_autoscale import Fleet
from gpufleet.loadgen import kserve_body
from gpufleet.modelserver.launch import model_server

NAME = "roll"
REPLICAS = 3


@dataclass
class Load:
    """Evenly spaced KServe infer requests through the gateway until ``stop``; outcomes
    counted (``200``, another status, ``timeout``, ``conn``)."""

    url: str
    token: str
    qps: float
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)

    async def _run(self) -> None:
        import aiohttp

        body = kserve_body()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        timeout = aiohttp.ClientTimeout(total=30)
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:

            async def one() -> None:
                try:
                    async with session.post(self.url, data=body) as resp:
                        data = await resp.read()
                        self.outcomes[str(resp.status)] += 1
                        if resp.status == 200:
                            self.versions[_version(data)] += 1
                except TimeoutError:
                    self.outcomes["timeout"] += 1
                except aiohttp.ClientError:
                    self.outcomes["conn"] += 1

            t0, k = loop.time(), 0
            while not self.stop.is_set():
                wait = t0 + k / self.qps - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                task = loop.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                k += 1
            if tasks:
                await asyncio.gather(*tasks)

    def run(self) -> None:
        asyncio.run(self._run())

    def failed(self) -> int:
        return sum(n for what, n in self.outcomes.items() if what != "200")


def _version(data: bytes) -> str:
    import json

    try:
        return str(json.loads(data).get("model_version", "?"))
    except ValueError:
        return "?"


@dataclass
class Monitor:
    """``GET /v1/services/roll`` every 0.1 s: the fewest ready replicas since ``mark``,
    and the first time the rollout reads ``complete`` / ``stalled`` after it."""

    api: httpx.Client
    stop: threading.Event = field(default_factory=threading.Event)
    min_ready: int | None = None
    states: dict[str, float] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    generation: int = 0

    def mark(self, generation: int) -> None:
        self.min_ready, self.states, self.generation = None, {}, generation

    def run(self) -> None:
        while not self.stop.is_set():
            r = self.api.get(f"/services/{NAME}")
            if r.status_code == 200:
                out = r.json()
                self.last = out
                ready = sum(1 for x in out["replicas"] if x["ready"] and not x["draining"] and not x["warm"])
                if self.generation:
                    self.min_ready = ready if self.min_ready is None else min(self.min_ready, ready)
                    roll = out.get("rollout") or {}
                    if roll.get("generation") == self.generation and roll.get("state") in (
                        "complete",
                        "stalled",
                    ):
                        self.states.setdefault(roll["state"], time.monotonic())
            time.sleep(0.1)


def one_run(args: argparse.Namespace, case: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        os.chmod(tmp, 0o711)
        fleet = Fleet(Path(tmp), args.nodes, refresh=args.refresh, sync_s=args.sync_interval)
        threads: list[threading.Thread] = []
        load: Load | None = None
        mon = Monitor(fleet.api)
        try:
            launch = model_server(
                as_other_account=os.geteuid() == 0,
                args=(
                    "--launch-overhead-us",
                    str(int(args.compute_ms * 1000)),
                    "--load-delay",
                    f"{args.load_delay}s",
                ),
            )
            spec = {
                "name": NAME, "team": "bench", "pool": "bench", "command": launch.command, "env": launch.env,
                "replicas": REPLICAS, "protocol": "kserve-v2", "readiness_timeout": args.readiness_timeout,
                "progress_deadline": args.progress_deadline,
            }  # fmt: skip
            fleet.api.put(f"/services/{NAME}", json=spec).raise_for_status()
            _until(fleet.api, lambda o: _ready(o) == REPLICAS and o["rollout"]["state"] == "complete", 120)
            token = fleet.api.post(f"/services/{NAME}/tokens").json()["token"]
            base = f"http://127.0.0.1:{fleet.gw_port}/s/{NAME}"
            deadline = time.monotonic() + 10
            while (
                httpx.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {token}"}).status_code
                != 200
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway never learnt the service token")
                time.sleep(0.1)
            load = Load(url=f"{base}/v2/models/mlp/infer", token=token, qps=args.qps)
            threads = [
                threading.Thread(target=load.run, daemon=True),
                threading.Thread(target=mon.run, daemon=True),
            ]
            for t in threads:
                t.start()
            time.sleep(args.settle)
            mon.mark(2)
            begun = time.monotonic()
            patch = (
                {"model_version": "2"} if case == "good" else {"command": ["sh", "-c", "exit 3"]}
            )  # the CLI's --model-version 2 / --command "sh -c 'exit 3'"
            fleet.api.patch(f"/services/{NAME}", json=patch).raise_for_status()
            want = "complete" if case == "good" else "stalled"
            deadline = time.monotonic() + args.timeout
            while want not in mon.states and time.monotonic() < deadline:
                time.sleep(0.1)
            took = mon.states[want] - begun if want in mon.states else None
            time.sleep(args.hold)
            load.stop.set()
            mon.stop.set()
            for t in threads:
                t.join(40)
            final = mon.last
            old_ready = sum(1 for x in final.get("replicas", []) if x["ready"] and x["generation"] == 1)
            events = fleet.api.get(f"/services/{NAME}/events", params={"limit": 50}).json()
        finally:
            if load is not None:
                load.stop.set()
            mon.stop.set()
            fleet.close()
    return {
        "took_s": took,
        "failed": load.failed(),
        "requests": sum(load.outcomes.values()),
        "outcomes": dict(load.outcomes),
        "versions": dict(load.versions),
        "min_ready": mon.min_ready,
        "old_ready_at_end": old_ready,
        "rollout": (final.get("rollout") or {}).get("reason"),
        "events": [f"{e['kind']}: {e['reason']}" for e in events],
    }


def _ready(out: dict[str, Any]) -> int:
    return sum(1 for x in out.get("replicas", []) if x["ready"] and not x["draining"] and not x["warm"])


def _until(api: httpx.Client, check: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        out: dict[str, Any] = api.get(f"/services/{NAME}").json()
        if check(out):
            return out
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service did not come up: {out}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one run of each case")
    ap.add_argument("--cases", default="good,broken")
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--qps", type=float, default=50.0)
    ap.add_argument("--compute-ms", type=float, default=4.0)
    ap.add_argument("--load-delay", type=float, default=2.0, help="model load time of a new replica, s")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of load before the update")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds of load after complete/stalled")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for complete/stalled")
    ap.add_argument("--readiness-timeout", type=float, default=30.0)
    ap.add_argument("--progress-deadline", type=float, default=120.0)
    ap.add_argument("--refresh", type=float, default=1.0, help="the gateway's --refresh (its default)")
    ap.add_argument("--sync-interval", type=float, default=10.0, help="the agents' (their default)")
    ap.add_argument("--verbose", action="store_true", help="print each run's outcomes and events")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.hold = 1, 5.0
    cases = [c for c in ("good", "broken") if c in args.cases.split(",")]
    print(
        f"rollouts of {REPLICAS} replicas under {args.qps:g} req/s through the gateway "
        f"({args.compute_ms:g} ms per request, {args.load_delay:g} s model load), {args.runs} run(s) per case"
    )
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(args.runs):
        for case in cases if r % 2 == 0 else cases[::-1]:
            got = one_run(args, case)
            rows[case].append(got)
            print(
                f"  run {r + 1} {case:<7} {_s(got['took_s'])} to "
                f"{'complete' if case == 'good' else 'stalled'}; "
                f"failed {got['failed']} of {got['requests']}, min ready {got['min_ready']}, "
                f"generation-1 ready at the end {got['old_ready_at_end']}",
                flush=True,
            )
            if args.verbose:
                print(f"      outcomes {got['outcomes']}, versions {got['versions']}")
                print(f"      rollout: {got['rollout']}")
                for line in reversed(got["events"][:20]):
                    print(f"      {line}")

    print(
        f"\n  {'case':<8}{'failed (median)':>16}{'failed (max)':>14}{'min ready':>11}"
        f"{'time (median)':>24}  goal"
    )
    met_all = True
    for case in cases:
        runs = rows[case]
        failed = [x["failed"] for x in runs]
        min_ready = min((x["min_ready"] for x in runs if x["min_ready"] is not None), default=None)
        times = [x["took_s"] for x in runs]
        took = (
            statistics.median(t for t in times if t is not None)
            if all(t is not None for t in times)
            else None
        )
        ok = max(failed) == 0 and min_ready is not None and min_ready >= REPLICAS and took is not None
        if case == "broken":
            ok = ok and all(x["old_ready_at_end"] == REPLICAS for x in runs)
        met_all = met_all and ok
        what = "to complete" if case == "good" else "to stalled"
        print(
            f"  {case:<8}{statistics.median(failed):>16g}{max(failed):>14}{_n(min_ready):>11}"
            f"{_s(took) + ' ' + what:>24}  {'met' if ok else 'NOT met'}"
        )
    print(
        f"  goals (0 failed, never below {REPLICAS} ready, a broken rollout stalls): "
        f"{'met' if met_all else 'NOT met'}"
    )


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


if __name__ == "__main__":
    main()
