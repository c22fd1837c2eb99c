"""What a large job array costs (issue 35): submit it held, list the queue with it, hold
and release it, cancel it.

Starts ``gpufleet server`` in a subprocess on a temp SQLite file (after ``gpufleet db
upgrade``; the admin's token from GPUFLEET_ADMIN_TOKEN, its request bucket off), makes a
team and an empty pool (no node: nothing the array holds ever runs), then ``--runs``
times: submits an array of ``--tasks`` tasks held, and times, each through the API in
this process (``GpufleetClient``, as the CLI asks; the client's own timeout is lifted
so that a slow operation is measured, not cut off):

- ``submit``: ``POST /v1/jobs`` with ``array=0-N`` and ``hold`` (``--arrays`` of them, all
  named ``sweepRUN``: then the bulk steps below match them by name, not by array id, so
  that ``--arrays 10`` measures 100,000 tasks against the issue's figures);
- ``queue (expanded)``: every page of ``GET /v1/jobs?state=PENDING,HELD,SCHEDULED,RUNNING``
  (``GpufleetClient.job_listing``, one item per task), and its JSON's size;
- ``queue (collapsed)``: the same listing as ``gpufleet queue`` and ``squeue`` ask it
  now (``arrays=collapsed``: the waiting tasks of an array one item); ``n/a`` on a server
  that does not know it (it lists every task);
- ``release`` then ``hold``: the whole array, ``POST /v1/jobs/release`` and
  ``/v1/jobs/hold`` with ``{"array": id}``; a server without them is timed doing what a
  user had to, ``POST /v1/jobs/{id}/release`` per task, on the first ``--sample`` tasks
  (the same tasks both ways) and scaled to the array (marked ``~``);
- ``cancel``: ``POST /v1/jobs/cancel`` with ``{"array": id}``, and whether every task
  was CANCELLED after it.

The table shows the median of the runs (seconds, or KB), the fastest, and the issue's
goal where it has one (its figures are for 100,000 tasks; gpufleet's arrays stop at
``arrayspec.MAX_TASKS``). Run it under ``flock /tmp/bench.lock``:

    .venv/bin/python bench/bench_arrays.py [--runs 3] [--tasks 10000] [--arrays 1] [--sample 300]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gpufleet.client import ClientError, GpufleetClient

TOKEN = "gf_bench_arrays_admin_token"
TEAM = "bench"
POOL = "benchpool"
LIVE = ["PENDING", "HELD", "SCHEDULED", "RUNNING"]
GOALS = {"submit": 0.5, "queue (collapsed)": 0.2, "cancel": 1.0}
"""Issue 35's figures (seconds), for 100,000 tasks."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpufleet() -> list[str]:
    script = Path(sys.executable).with_name("gpufleet")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpufleet"]


def start(tmp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    gf, db_url = _gpufleet(), f"sqlite:///{tmp / 'bench.db'}"
    subprocess.run([*gf, "db", "upgrade", "--database-url", db_url], check=True, capture_output=True)
    port = _port()
    args = ["server", "--port", str(port), "--database-url", db_url, "--rate-admin", "off"]
    proc = subprocess.Popen(
        [*gf, *args],
        env={**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/v1/healthz").status_code == 200:
                return url, proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _bulk(
    c: GpufleetClient, verb: str, match: dict[str, object], tasks: list[int], sample: int
) -> tuple[float, bool]:
    """Seconds to ``verb`` (hold/release) the matched tasks, and whether it was estimated
    from per-task requests on a server without the bulk endpoint."""
    try:
        return timed(lambda: c.request("POST", f"/jobs/{verb}", json=match)), False
    except ClientError as exc:
        if exc.status not in (404, 405, 422):
            raise
    some = tasks[:sample]
    took = timed(lambda: [c.request("POST", f"/jobs/{t}/{verb}") for t in some])
    # (the others are left as they are: hold then takes back the sample that release moved)
    return took * len(tasks) / max(1, len(some)), True


def one_run(
    c: GpufleetClient, run: int, *, tasks: int, arrays: int, sample: int
) -> tuple[dict[str, float], set[str], bool]:
    name = f"sweep{run}"
    spec = {
        "command": ["python", "task.py"],
        "gpus": 1,
        "pool": POOL,
        "name": name,
        "array": f"0-{tasks - 1}",
        "hold": True,
    }
    out: dict[str, float] = {}
    got: dict[str, object] = {}
    heads: list[int] = []
    out["submit"] = timed(
        lambda: heads.extend(int(c.request("POST", "/jobs", json=spec)["id"]) for _ in range(arrays))
    )
    match: dict[str, object] = {"array": heads[0]} if arrays == 1 else {"name": name}
    out["queue (expanded)"] = timed(lambda: got.update(items=c.job_listing(states=LIVE)))
    items: list[dict[str, object]] = got["items"]  # type: ignore[assignment]
    out["queue (expanded) KB"] = len(httpx.Response(200, json={"items": items}).content) / 1000
    estimated: set[str] = set()
    params = {"state": ",".join(LIVE), "arrays": "collapsed"}
    out["queue (collapsed)"] = timed(lambda: got.update(folded=c.pages("/jobs", params)))
    folded: list[dict[str, object]] = got["folded"]  # type: ignore[assignment]
    if len(folded) >= len(items):
        estimated.add("queue (collapsed)")  # the server ignored it: not there
    out["queue (collapsed) KB"] = len(httpx.Response(200, json={"items": folded}).content) / 1000
    ids = sorted(int(j["id"]) for j in items if j.get("array_job_id") in heads)  # type: ignore[call-overload]
    for verb in ("release", "hold"):
        out[verb], guess = _bulk(c, verb, match, ids, sample)
        if guess:
            estimated.add(verb)
    out["cancel"] = timed(lambda: c.request("POST", "/jobs/cancel", json=match))
    left = c.job_listing(states=LIVE)
    return out, estimated, not left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=10_000, help="tasks an array (arrayspec.MAX_TASKS at most)")
    ap.add_argument("--arrays", type=int, default=1, help="arrays a run, of one name (matched by it)")
    ap.add_argument("--sample", type=int, default=300, help="per-task requests timed where no bulk endpoint")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url, proc = start(Path(tmp))
        try:
            with GpufleetClient(url, TOKEN, timeout=600.0) as c:
                c.request("POST", "/teams", json={"name": TEAM})
                c.request("POST", f"/teams/{TEAM}/members", json={"user": "admin"})
                c.request("POST", "/pools", json={"name": POOL, "gpu": True})
                runs = [
                    one_run(c, r, tasks=args.tasks, arrays=args.arrays, sample=args.sample)
                    for r in range(args.runs)
                ]
        finally:  # a loaded machine may take longer than 10 s to stop it: the runs still count
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    what = f"{args.arrays} arrays of one name (matched by it)" if args.arrays > 1 else "an array"
    print(f"{what} of {args.tasks} held tasks, {args.runs} runs, SQLite, one server process")
    print(f"{'step':<22} {'median':>10} {'fastest':>10} {'goal (100k)':>12}")
    estimated = set().union(*(r[1] for r in runs))
    for key in runs[0][0]:
        vals = [r[0][key] for r in runs]
        unit = "" if key.endswith("KB") else " s"
        mark = "~" if key in estimated and key != "queue (collapsed)" else ""
        med = f"{mark}{statistics.median(vals):.3f}{unit}"
        if key.startswith("queue (collapsed)") and "queue (collapsed)" in estimated:
            med = "n/a"
        goal = f"< {GOALS[key]} s" if key in GOALS else ""
        print(f"{key:<22} {med:>10} {min(vals):>8.3f}{unit:2} {goal:>12}")
    print(f"every task CANCELLED after cancel: {all(r[2] for r in runs)}")
    if estimated - {"queue (collapsed)"}:
        print(f"~: per-task requests on {args.sample} tasks, scaled to {args.tasks} (no bulk endpoint)")


if __name__ == "__main__":
    main()
