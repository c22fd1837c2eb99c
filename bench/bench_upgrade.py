"""A rolling driver upgrade of a 50-node simulated fleet under load (issue 34).

A ``gpufleet server`` (SQLite, ``--service-drain 2s``) and ``--nodes`` in-process agents
with 2 simulated GPUs each on driver 535.104.05, each started with the upgrade hook
``driver`` (a root-owned shell script that prints and exits 0); after a successful hook
a simulated node reports the driver the upgrade expected. A steady workload is
submitted the whole time (simulated 1-GPU jobs of 8-20 s, about ``--busy`` of the
GPUs), and one service (``--replicas`` replicas of a Python HTTP server, readiness
``/``) serves. One node, ``--bad`` in the rollout's order, is planted bad: its GPU 0
fails the smoke check.

``gpufleet upgrade start --nodes b[00-49] --expect-driver 550.54.15 --command driver
--max-unavailable 5 --drain-timeout 10s``; the bench waits for the pause at the bad
node, checks that no node of a later batch was touched, clears the planted fault (the
operator's fix), ``upgrade resume``s and waits for ``done``. Reported: the time to the
pause, the time from resume to done and the total; jobs lost (submitted jobs that did
not end COMPLETED once the workload stops and the queue empties: goal 0), jobs
requeued by the drains; the service's fewest ready replicas seen during the upgrade
(sampled every 0.2 s; goal: never below ``--replicas``); and every node's driver after.

    flock /tmp/bench.lock .venv/bin/python bench/bench_upgrade.py [--nodes 50] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent import (
    Agent,
    AgentConfig,
    HttpTransport,
    RunAs,
    SimSpec,
    SimulatedProbe,
    UserMap,
    make_agent,
)

ADMIN = "gf_bench_upgrade_admin"
OLD, NEW = "535.104.05", "550.54.15"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


class Fleet:
    def __init__(self, work: Path, nodes: int, bad: int) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        db = f"sqlite:///{work / 'g.db'}"
        self.server = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "server", "--port", str(port), "--database-url", db,
             "--service-drain", "2s"],
            env={**os.environ, "GPUFLEET_ADMIN_TOKEN": ADMIN}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_http(self.url + "/v1/healthz")
        self.api = httpx.Client(
            base_url=self.url + "/v1", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
        )
        self.api.post("/pools", json={"name": "bench"}).raise_for_status()
        self.api.post("/teams", json={"name": "bench"}).raise_for_status()
        self.api.post("/teams/bench/members", json={"user": "admin"}).raise_for_status()
        hooks = work / "hooks"
        hooks.mkdir(mode=0o755)
        hook = hooks / "upgrade-driver"
        hook.write_text('#!/bin/sh\necho "installing driver $1"\nexit 0\n')
        hook.chmod(0o755)
        self.stop = threading.Event()
        self.agents: list[Agent] = []
        self.probes: list[SimulatedProbe] = []
        self.names = [f"b{i:02d}" for i in range(nodes)]
        for i, name in enumerate(self.names):
            self.api.put(f"/nodes/{name}", json={"pool": "bench", "gpus": []}).raise_for_status()
            token = self.api.post("/nodes/join-tokens", json={"node": name}).json()["token"]
            config = AgentConfig(
                node=name, work_dir=work / name, address="127.0.0.1", sync_interval_s=5.0,
                news_gap_s=0.05, tick_s=0.1, grace_s=2.0, probe_interval_s=0.25,
                upgrade_hooks={"driver": hook},
            )  # fmt: skip
            probe = SimulatedProbe(
                node=name, spec=SimSpec(gpus=2), driver=OLD, smoke_fails=[0] if i == bad else []
            )
            run_as = RunAs(users=UserMap(fallback="nobody"), node=name)  # never a job as root
            agent = make_agent(
                config=config, probe=probe, transport=HttpTransport(self.url, token), run_as=run_as
            )
            agent.sync_once()
            self.agents.append(agent)
            self.probes.append(probe)
            threading.Thread(target=agent.run, args=(self.stop,), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        for a in self.agents:
            with contextlib.suppress(Exception):
                a.stop_all(timeout_s=2)
                a.close()
        self.api.close()
        self.server.terminate()
        self.server.wait(10)


class Workload:
    """Simulated 1-GPU jobs at a steady rate; their ids."""

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate = url, rate
        self.ids: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng = random.Random(7)
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=self.url + "/v1", headers=headers, timeout=30) as c:
            while not self.stop.is_set():
                dur = rng.uniform(8, 20)
                spec = {
                    "command": ["sleep", f"{dur:.0f}"], "gpus": 1, "pool": "bench", "team": "bench",
                    "env": {"GPUFLEET_SIMULATE_S": f"{dur:.1f}"},
                }  # fmt: skip
                with contextlib.suppress(httpx.HTTPError):
                    r = c.post("/jobs", json=spec)
                    if r.status_code == 201:
                        self.ids.append(int(r.json()["id"]))
                self.stop.wait(1.0 / self.rate)


class ReadyWatch:
    """The service's ready replicas (in rotation, not draining), every 0.2 s."""

    def __init__(self, api: httpx.Client, name: str) -> None:
        self.api, self.name = api, name
        self.low: int | None = None
        self.watching = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def ready(self) -> int:
        out = self.api.get(f"/services/{self.name}").json()
        return sum(1 for r in out["replicas"] if r["ready"] and not r.get("warm") and not r.get("draining"))

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.watching.is_set():
                with contextlib.suppress(httpx.HTTPError, KeyError):
                    n = self.ready()
                    self.low = n if self.low is None else min(self.low, n)
            self.stop.wait(0.2)


def until(what: str, pred: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--max-unavailable", type=int, default=5)
    ap.add_argument("--bad", type=int, default=27, help="position of the planted bad node")
    ap.add_argument("--busy", type=float, default=0.5, help="share of the GPUs the workload keeps busy")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="12 nodes, max unavailable 3, bad node 5")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.max_unavailable, args.bad = 12, 3, 5
    with tempfile.TemporaryDirectory(prefix="bench-upgrade-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        fleet = Fleet(work, args.nodes, args.bad)
        try:
            run(fleet, args)
        finally:
            fleet.close()


def run(fleet: Fleet, args: argparse.Namespace) -> None:
    api = fleet.api
    serve = ["sh", "-c", 'exec python3 -m http.server "$PORT" --bind 127.0.0.1']
    spec = {
        "name": "web", "team": "bench", "pool": "bench", "command": serve, "replicas": args.replicas,
        "health_path": "/", "readiness_timeout": 60,
    }  # fmt: skip
    api.put("/services/web", json=spec).raise_for_status()
    watch = ReadyWatch(api, "web")
    until("the service to be ready", lambda: watch.ready() >= args.replicas, 90)
    gpus = 2 * args.nodes
    load = Workload(fleet.url, rate=args.busy * gpus / 14.0)  # jobs of 14 s on average
    time.sleep(20)  # the fleet fills up
    env = {**os.environ, "GPUFLEET_URL": fleet.url, "GPUFLEET_TOKEN": ADMIN}
    hostlist = f"b[00-{args.nodes - 1:02d}]"
    cmd = [sys.executable, "-m", "gpufleet", "upgrade", "start", "--nodes", hostlist, "--expect-driver", NEW,
           "--command", "driver", "--max-unavailable", str(args.max_unavailable), "--drain-timeout", "10s",
           "--json"]  # fmt: skip
    watch.watching.set()
    t0, started_at = time.monotonic(), time.time()
    started = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    import json

    rid = json.loads(started.stdout)["id"]
    paused = until(
        "the pause", lambda: (r := api.get(f"/upgrades/{rid}").json())["state"] == "paused" and r, 900
    )
    t_pause = time.monotonic() - t0
    bad = fleet.names[args.bad]
    time.sleep(3)  # nodes of the bad one's window finish their own step; nothing new starts
    held = api.get(f"/upgrades/{rid}").json()
    touched = [i for i, m in enumerate(held["nodes"]) if m["state"] != "waiting"]
    after_batch = (args.bad // args.max_unavailable + 1) * args.max_unavailable  # the next batch's first
    stopped_at_batch = (
        bad in (paused["pause_reason"] or "")
        and max(touched) < after_batch
        and all(m["state"] == "waiting" for m in held["nodes"][after_batch:])
    )
    fleet.probes[args.bad].smoke_fails.clear()  # the operator's fix
    t1 = time.monotonic()
    subprocess.run([sys.executable, "-m", "gpufleet", "upgrade", "resume", str(rid)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    done = until(
        "the upgrade", lambda: (r := api.get(f"/upgrades/{rid}").json())["state"] == "done" and r, 1800
    )
    t_done = time.monotonic()
    watch.watching.clear()
    load.stop.set()
    load.thread.join(5)
    until("the queue to empty", lambda: not _unfinished(api, load.ids), 300)
    ends = _ends(api, load.ids)
    lost = sum(n for state, n in ends.items() if state != "COMPLETED")
    requeued = _requeued(api, load.ids)
    drivers = {api.get(f"/nodes/{n}").json().get("driver_version") for n in fleet.names}
    watch.stop.set()
    rows = [
        ("nodes / max unavailable", f"{args.nodes} / {args.max_unavailable}"),
        ("planted bad node (smoke fails on GPU 0)", f"{bad} (position {args.bad})"),
        ("time to the pause at the bad node", f"{t_pause:.1f} s"),
        ("pause reason", paused["pause_reason"]),
        ("stopped at its batch (no later batch touched)", "yes" if stopped_at_batch else "NO"),
        ("time from resume to done", f"{t_done - t1:.1f} s"),
        ("total (start to done, pause included)", f"{t_done - t0:.1f} s"),
        ("jobs submitted / completed / lost", f"{len(load.ids)} / {ends.get('COMPLETED', 0)} / {lost}"),
        ("jobs requeued by drains", str(requeued)),
        ("service replicas wished / fewest ready during the upgrade", f"{args.replicas} / {watch.low}"),
        ("drivers after", ", ".join(sorted(str(d) for d in drivers))),
        ("nodes done", str(done["counts"].get("done"))),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    print(f"\nthe bad node's steps (s after the start of the upgrade), {bad}:")
    for e in api.get("/fleet/events", params={"node": bad, "limit": 50}).json():
        if e["at"] >= started_at:
            print(f"  {e['at'] - started_at:7.1f}  {e['kind']}: {e['reason'][:100]}")


def _unfinished(api: httpx.Client, ids: list[int]) -> bool:
    live = ("PENDING", "SCHEDULED", "RUNNING")
    return any(s in live for s in _ends(api, ids))


def _jobs(api: httpx.Client, ids: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    want = set(ids)
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000, "pool": "bench"}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/jobs", params=params).json()
        out += [j for j in page["items"] if j["id"] in want]
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def _ends(api: httpx.Client, ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for j in _jobs(api, ids):
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    return counts


def _requeued(api: httpx.Client, ids: list[int]) -> int:
    return sum(int(j.get("attempts") or 0) for j in _jobs(api, ids))


if __name__ == "__main__":
    main()
