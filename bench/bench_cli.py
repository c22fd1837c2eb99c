"""How fast the ``gpufleet`` command answers: a Slurm user runs ``gpufleet queue`` as
often as ``squeue``, and every run pays Python's start-up and the CLI's imports.

Starts ``gpufleet server`` in a subprocess on a temp SQLite file (after ``gpufleet db
upgrade``; the admin's token from GPUFLEET_ADMIN_TOKEN, its request bucket off), makes a
team and an empty pool, submits ``--jobs`` 1-GPU jobs into that pool through the API (no
node: they stay PENDING, so ``gpufleet queue`` lists all of them), and saves the
connection with ``gpufleet login`` in a temp config dir (XDG_CONFIG_HOME), so the timed
commands read it as a user's would. Then it times, ``--runs`` times each, round-robin
(one untimed warm-up round first), the wall time of whole processes:

- the baselines: ``python -c pass`` and ``python -S -c pass`` (the interpreter's own
  start-up, with and without ``site``): no command can be faster, and ``x start-up`` in
  the table is a command's time divided by ``python -c pass``'s, a figure that moves far
  less than milliseconds when the machine is shared or slower;
- ``gpufleet --help``, ``gpufleet queue`` (all ``--jobs`` jobs, two pages),
  ``gpufleet queue --json``, ``gpufleet submit -p POOL -- sleep 1`` (a job more each
  run; it asks for prices too), ``gpufleet jobs show ID``, ``gpufleet nodes`` (``--nodes``
  nodes registered in the pool);
- the Slurm commands as a job runs them (issue 31: ``python -s -m gpufleet.slurm NAME``,
  what the launchers on a job's PATH exec): ``scontrol show hostnames`` (every task
  start; no server), ``scontrol show job ID``, ``squeue -h``, ``sinfo``, ``sbatch
  --parsable SCRIPT`` (a job more each run), ``sacct -j ID -X -P``;
- with ``PYTHONDONTWRITEBYTECODE`` unset, as on a user's machine (the warm-up round
  writes gpufleet's ``.pyc`` files; without them each command compiles its modules);
- ``squeue`` and ``sinfo``, if they are on PATH (``not installed`` otherwise; timed
  whatever they answer, as they talk to this machine's slurmctld, not to gpufleet).

The command is the console script next to this Python (``.venv/bin/gpufleet``), as a
user runs it, else ``python -m gpufleet``. Output goes to /dev/null. The table shows
the median and the fastest run, the goal and whether the median meets it: issue 18's
(``--help`` <= 150 ms) and issue 31's for ``submit``, ``queue``, ``nodes``, ``jobs
show`` and the Slurm commands: 5 x the median of ``python -c pass`` + 60 ms, on the
machine that runs the bench (so ``goal ms`` moves with it).

    .venv/bin/python bench/bench_cli.py [--runs 10] [--jobs 1000] [--nodes 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

TOKEN = "gf_bench_cli_admin_token"
TEAM = "bench"
POOL = "benchpool"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpufleet_argv() -> list[str]:
    script = Path(sys.executable).with_name("gpufleet")
    if script.is_file():
        return [str(script)]
    found = shutil.which("gpufleet")
    return [found] if found else [sys.executable, "-m", "gpufleet"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    label: str
    argv: list[str]
    goal_ms: float | None = None
    must_pass: bool = True
    """False for squeue and sinfo: timed even when no slurmctld answers them."""


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(gf: list[str], db_url: str, env: dict[str, str]) -> Server:
    subprocess.run([*gf, "db", "upgrade", "--database-url", db_url], check=True, capture_output=True, env=env)
    port = _port()
    # The bench's requests are the admin's: no request bucket (bench_flood.py measures limits).
    args = ["server", "--port", str(port), "--database-url", db_url, "--rate-admin", "off"]
    proc = subprocess.Popen([*gf, *args], env={**env, "GPUFLEET_ADMIN_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(url + "/v1/healthz").status_code == 200:
                return Server(url=url, proc=proc)
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def fill(url: str, jobs: int, nodes: int = 0) -> int:
    """A team, a pool of ``nodes`` registered 8-GPU nodes whose agents never report (they
    go NotReady: nothing runs) and ``jobs`` pending jobs in it; the last job's id."""
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c:
        c.post("/teams", json={"name": TEAM}).raise_for_status()
        c.post(f"/teams/{TEAM}/members", json={"user": "admin"}).raise_for_status()
        c.post("/pools", json={"name": POOL, "gpu": True}).raise_for_status()
        for n in range(nodes):
            name = f"bench-{n:03d}"
            gpus = [{"index": i, "model": "H100", "uuid": f"GPU-{name}-{i}"} for i in range(8)]
            c.put(f"/nodes/{name}", json={"pool": POOL, "gpus": gpus}).raise_for_status()
        last = 0
        for i in range(jobs):
            body = {"command": ["python", "train.py", str(i)], "gpus": 1, "pool": POOL, "name": f"train-{i}"}
            r = c.post("/jobs", json=body)
            r.raise_for_status()
            last = int(r.json()["id"])
        return last


def once(case: Case, env: dict[str, str]) -> float:
    """Wall seconds of one run of the case (stdout to /dev/null); a gpufleet command must
    exit 0."""
    t0 = time.perf_counter()
    done = subprocess.run(case.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    took = time.perf_counter() - t0
    if done.returncode != 0 and case.must_pass:
        raise SystemExit(f"{case.label}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took


def measure(cases: list[Case], env: dict[str, str], runs: int) -> dict[str, list[float]]:
    """Round-robin, so that whatever else the machine does falls on every case alike."""
    for case in cases:
        once(case, env)  # warm-up: page cache, .pyc files, the server's connection pool
    times: dict[str, list[float]] = {c.label: [] for c in cases}
    for _ in range(runs):
        for case in cases:
            times[case.label].append(once(case, env))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=1000, help="Jobs in the system (pending) while timing.")
    ap.add_argument("--nodes", type=int, default=50, help="Nodes registered (never ready) while timing.")
    args = ap.parse_args()
    gf = gpufleet_argv()
    py = [sys.executable]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_CONFIG_HOME": str(Path(tmp) / "config")}
        for var in ("GPUFLEET_URL", "GPUFLEET_TOKEN", "GPUFLEET_CA_FILE", "GPUFLEET_ADMIN_TOKEN"):
            env.pop(var, None)
        # as a user's machine runs it: Python caches its compiled modules (the warm-up round
        # writes them), where this machine's environment may say not to
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        srv = start(gf, f"sqlite:///{Path(tmp) / 'bench.db'}", env)
        try:
            last = fill(srv.url, args.jobs, args.nodes)
            script = Path(tmp) / "job.sh"
            script.write_text(f"#!/bin/bash\n#SBATCH -p {POOL}\n#SBATCH --gres=gpu:1\nsrun hostname\n")
            subprocess.run(
                [*gf, "login", srv.url, "--token", TOKEN], check=True, capture_output=True, env=env
            )
            base = [Case(label="python -c pass", argv=[*py, "-c", "pass"])]
            fast = -1.0  # issue 31's goal: 5 x python -c pass + 60 ms, set once measured
            slurm_py = [*py, "-s", "-m", "gpufleet.slurm"]  # as the launchers on a job's PATH
            base.append(Case(label="python -S -c pass", argv=[*py, "-S", "-c", "pass"]))
            cases = [
                Case(label="gpufleet --help", argv=[*gf, "--help"], goal_ms=150),
                Case(label="gpufleet queue", argv=[*gf, "queue"], goal_ms=fast),
                Case(label="gpufleet queue --json", argv=[*gf, "queue", "--json"]),
                Case(
                    label=f"gpufleet submit -p {POOL} -- sleep 1",
                    argv=[*gf, "submit", "--pool", POOL, "--", "sleep", "1"],
                    goal_ms=fast,
                ),
                Case(label=f"gpufleet jobs show {last}", argv=[*gf, "jobs", "show", str(last)], goal_ms=fast),
                Case(label="gpufleet nodes", argv=[*gf, "nodes"], goal_ms=fast),
                Case(
                    label="scontrol show hostnames gpu-[001-064]",
                    argv=[*slurm_py, "scontrol", "show", "hostnames", "gpu-[001-064]"],
                    goal_ms=fast,
                ),
                Case(
                    label=f"scontrol show job {last}",
                    argv=[*slurm_py, "scontrol", "show", "job", str(last)],
                    goal_ms=fast,
                ),
                Case(label="squeue -h", argv=[*slurm_py, "squeue", "-h"], goal_ms=fast),
                Case(label="sinfo", argv=[*slurm_py, "sinfo"], goal_ms=fast),
                Case(
                    label="sbatch --parsable job.sh",
                    argv=[*slurm_py, "sbatch", "--parsable", str(script)],
                    goal_ms=fast,
                ),
                Case(
                    label=f"sacct -j {last} -X -P",
                    argv=[*slurm_py, "sacct", "-j", str(last), "-X", "-P"],
                    goal_ms=fast,
                ),
            ]
            slurm = [
                Case(label=n, argv=[p], must_pass=False)
                for n in ("squeue", "sinfo")
                if (p := shutil.which(n))
            ]
            times = measure(base + cases + slurm, env, args.runs)
        finally:
            srv.stop()
    start_up = statistics.median(times["python -c pass"])
    rows = [["command", "median ms", "min ms", "x start-up", "goal ms", "ok"]]
    for case in base + cases + slurm:
        ts = times[case.label]
        med = statistics.median(ts)
        goal_ms = case.goal_ms if case.goal_ms != fast else 5 * start_up * 1000 + 60
        goal = "-" if goal_ms is None else f"{goal_ms:.0f}"
        ok = "-" if goal_ms is None else ("ok" if med * 1000 <= goal_ms else "NO")
        rows.append(
            [case.label, f"{med * 1000:.0f}", f"{min(ts) * 1000:.0f}", f"{med / start_up:.1f}", goal, ok]
        )
    for name in ("squeue", "sinfo"):
        if not shutil.which(name):
            rows.append([name, "not installed", "-", "-", "-", "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(
        f"{' '.join(gf)}: {args.runs} runs each (median), {args.jobs} pending jobs and {args.nodes} nodes "
        f"in the system, {os.cpu_count()} cores shared with the server; x start-up: / python -c pass; "
        "goal of issue 31: 5 x python -c pass + 60 ms"
    )
    for r in rows:
        print(
            "  ".join([r[0].ljust(widths[0]), *(v.rjust(w) for v, w in zip(r[1:], widths[1:], strict=True))])
        )


if __name__ == "__main__":
    main()
