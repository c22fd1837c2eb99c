"""The README's Slurm pipeline end to end (issue 18): an array of CPU preprocessing tasks
in a CPU-only pool, then an ``afterok`` GPU training job, submitted as two unchanged
``#SBATCH`` scripts through the CLI and run by two real agents on simulated GPUs. Checks
the order (training starts after every shard ended), the ``--output`` files (Slurm's
patterns, in the submit directory) and the Slurm variables the scripts read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobaccounts import JOB_ACCOUNT, ensure_account, passable, user_map_file
from server.conftest import Server, gpufleet, make_pool, make_team, ok, unique, wait_for

PREP = """#!/bin/bash
#SBATCH --job-name=prep
#SBATCH --partition={pool}
#SBATCH --array=0-3%2
#SBATCH --cpus-per-task=2
#SBATCH --time=10
#SBATCH --output=prep-%A_%a.out
#SBATCH --mail-type=FAIL
echo "shard $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT job $SLURM_ARRAY_JOB_ID cpus $SLURM_CPUS_PER_TASK"
echo "$SLURM_SUBMIT_DIR" > shard-$SLURM_ARRAY_TASK_ID.txt
"""
TRAIN = """#!/bin/bash
#SBATCH --job-name=train
#SBATCH --partition={pool}
#SBATCH --gres=gpu:2
#SBATCH --time=10
#SBATCH --output=%x-%j.out
shards=$(ls shard-*.txt | wc -l)
echo "train $SLURM_JOB_ID $SLURM_JOB_NAME gpus $SLURM_GPUS_ON_NODE nodes $SLURM_JOB_NODELIST shards $shards"
"""


@pytest.fixture
def fleet(server: Server, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A CPU-only pool and a GPU pool, a node and its agent in each (the CPU node's agent
    runs with ``--cpu-only``: no GPU, no NVML)."""
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    ensure_account(JOB_ACCOUNT)
    pools = {"cpu": make_pool(server, gpu=False), "gpu": make_pool(server)}
    users = user_map_file(tmp_path)
    procs = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    for kind, gpus in (("cpu", ["--cpu-only"]), ("gpu", ["--simulate-gpus", "2"])):
        node = unique(kind)
        assert gpufleet("node", "register", node, "--pool", pools[kind], env=server.env()).returncode == 0
        token_file = tmp_path / f"{node}.token"
        token_file.write_text(gpufleet("node", "join-token", "--node", node, env=server.env()).stdout)
        token_file.chmod(0o600)
        args = ["agent", "--server", server.url, "--token-file", str(token_file), "--name", node]
        args += [*gpus, "--work-dir", str(tmp_path / node), "--user-map", str(users)]
        args += ["--sync-interval", "1s", "--address", "127.0.0.1"]
        procs.append(subprocess.Popen([sys.executable, "-m", "gpufleet", *args], env=env))
    with server.client() as c:
        deadline = time.monotonic() + 30
        while not all(n["last_seen"] for n in ok(c.get("/nodes"))["items"] if n["pool"] in pools.values()):
            assert time.monotonic() < deadline, "the agents did not sync"
            time.sleep(0.1)
    try:
        yield pools
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def test_preprocess_on_cpus_then_train_on_gpus(server: Server, fleet: dict[str, str], tmp_path: Path) -> None:
    work = tmp_path / "submit"
    work.mkdir()
    work.chmod(0o777)  # the jobs' account writes its files here
    passable(work)
    (work / "prep.sh").write_text(PREP.format(pool=fleet["cpu"]))
    (work / "train.sh").write_text(TRAIN.format(pool=fleet["gpu"]))
    env = server.env()
    team = make_team(server)

    def cli(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet", *argv],
            capture_output=True, text=True, cwd=work, env={**os.environ, **env}, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    prep = int(cli("submit", "--parsable", "-A", team, "prep.sh"))
    train = int(cli("submit", "--parsable", "-A", team, "-d", f"afterok:{prep}", "train.sh"))
    trained = wait_for(server, train, "COMPLETED", timeout=60)
    with server.client() as c:
        shards = ok(c.get("/jobs", params={"array": prep}))["items"]
    assert [s["state"] for s in shards] == ["COMPLETED"] * 4
    assert trained["started_at"] >= max(s["ended_at"] for s in shards)  # afterok held it
    for task in range(4):
        said = (work / f"prep-{prep}_{task}.out").read_text()
        assert said == f"shard {task} of 4 job {prep} cpus 2\n"
        assert (work / f"shard-{task}.txt").read_text() == f"{work}\n"  # SLURM_SUBMIT_DIR, the cwd
    said = (work / f"train-{train}.out").read_text()
    assert said.startswith(f"train {train} train gpus 2 nodes ") and said.endswith(" shards 4\n"), said
    history = cli("history", "-j", str(prep), "-o", "JobID,State,ExitCode", "-P", "-n")
    assert history.splitlines() == [f"{prep}_{t}|COMPLETED|0:0" for t in range(4)]
