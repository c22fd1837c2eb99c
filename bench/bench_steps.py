"""How long a job step takes (issue 31: "a step should start within ~1 s on an idle
fleet"): the wall time of ``srun ... true`` inside a running 2-node job, as its batch
script sees it, which is everything a step costs: srun's start-up (Python and its
imports), the step's POST, the nodes' agents woken by the push doorbell and syncing, the
tasks started through the job wrapper as the job's account, their exits reported, and
srun seeing the step over (it polls every 50 ms, backing off to 0.5 s).

Starts ``gpufleet server`` in a subprocess on a temp SQLite file (the admin's token from
GPUFLEET_ADMIN_TOKEN, request buckets off), two agents in this process on simulated GPUs
(2 each; syncs every 10 s as in production: everything a step needs comes by push), and
one job over both nodes whose script times ``--runs`` steps of each kind with ``date``:

- ``srun -n1 true``: one task, on the batch host;
- ``srun -N2 true``: one task per node;
- ``srun -N2 --ntasks-per-node=2 true``: four tasks;
- and, as the floor no srun can beat, ``python -I -m gpufleet.slurm scontrol show hostnames``
  (the same interpreter start-up and package import, no server).

Jobs run as ``--account`` (default ``nobody``; a root agent never runs a job as root).
The table shows the median, fastest and slowest run of each.

    .venv/bin/python bench/bench_steps.py [--runs 10] [--account nobody]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from gpufleet.agent import AgentConfig, HttpTransport, RunAs, SimSpec, SimulatedProbe, UserMap, make_agent

TOKEN = "gf_bench_steps_admin_token"
KINDS = {
    "srun -n1 true": "srun -n1 true",
    "srun -N2 true": "srun -N2 true",
    "srun -N2 --ntasks-per-node=2 true": "srun -N2 --ntasks-per-node=2 true",
    "floor: scontrol show hostnames": "scontrol show hostnames a,b >/dev/null",
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--account", default="nobody")
    args = ap.parse_args()
    gf = [sys.executable, "-m", "gpufleet"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        db = f"sqlite:///{work / 'g.db'}"
        env = {**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN}
        subprocess.run([*gf, "db", "upgrade", "--database-url", db], check=True, capture_output=True, env=env)
        port = _port()
        server = subprocess.Popen(
            [
                *gf,
                "server",
                "--port",
                str(port),
                "--database-url",
                db,
                "--rate-admin",
                "off",
                "--rate-user",
                "off",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        stop = threading.Event()
        try:
            _wait_up(url)
            print(_run(url, work, args.runs, args.account, stop))
        finally:
            stop.set()
            server.terminate()
            server.wait(30)


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not start")


def _run(url: str, work: Path, runs: int, account: str, stop: threading.Event) -> str:
    h = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url + "/v1", headers=h, timeout=30) as c:
        c.post("/pools", json={"name": "steps", "gpu": True}).raise_for_status()
        agents = []
        for i in range(2):
            name = f"stepnode{i}"
            c.put(f"/nodes/{name}", json={"pool": "steps", "gpus": []}).raise_for_status()
            token = c.post("/nodes/join-tokens", json={"node": name}).json()["token"]
            config = AgentConfig(node=name, work_dir=work / name, address="127.0.0.1", grace_s=2.0)
            agent = make_agent(
                config=config,
                probe=SimulatedProbe(node=name, spec=SimSpec(gpus=2)),
                transport=HttpTransport(url, token),
                run_as=RunAs(users=UserMap(entries={}, fallback=account)),
            )
            agent.sync_once()
            threading.Thread(target=agent.run, args=(stop,), daemon=True).start()
            agents.append(agent)
        lines = [f"for i in $(seq {runs}); do"]
        for label, cmd in KINDS.items():
            lines.append(f't0=$(date +%s.%N); {cmd}; t1=$(date +%s.%N); echo "T|{label}|$t0|$t1"')
        lines.append("done")
        job = c.post(
            "/jobs",
            json={"command": ["bash", "-c", "\n".join(lines)], "nodes": 2, "gpus": 4, "pool": "steps"},
        ).json()
        deadline = time.monotonic() + 60 + runs * 30
        while c.get(f"/jobs/{job['id']}").json()["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            if time.monotonic() > deadline:
                raise SystemExit("the job did not end")
            time.sleep(0.2)
        text = c.get(f"/jobs/{job['id']}/logs").text
        for agent in agents:
            agent.stop_all(timeout_s=1.0)
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for line in text.splitlines():
        if line.startswith("T|"):
            _, label, t0, t1 = line.split("|")
            times[label].append((float(t1) - float(t0)) * 1000)
    out = [f"{'step':<36} {'runs':>4} {'median ms':>10} {'min ms':>8} {'max ms':>8}"]
    for label, ms in times.items():
        if not ms:
            out.append(f"{label:<36} {0:>4} {'-':>10}")
            continue
        out.append(f"{label:<36} {len(ms):>4} {statistics.median(ms):>10.0f} {min(ms):>8.0f} {max(ms):>8.0f}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
