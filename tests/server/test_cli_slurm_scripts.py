"""Real-script-shaped sbatch files (issue 31), submitted with ``gpufleet submit`` as a new
user would, unchanged but for the partition and account names: what the job asks for
once the server has resolved Slurm's defaults (the default pool, ``--exclusive``,
``--mem=0``, features), and the command line replacing a directive whole."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from server.conftest import Server, gpufleet, make_pool, make_team, ok, unique
from server.test_slurm_defaults import BIG_MEM, machine

MEGATRON = """#!/bin/bash
#SBATCH --job-name=megatron-gpt-175b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --exclusive
#SBATCH --constraint=ib
#SBATCH --hint=nomultithread
#SBATCH --time=04:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --wait-all-nodes=1

export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
srun python pretrain_gpt.py --tensor-model-parallel-size 8
"""
CSC = """#!/bin/bash
#SBATCH --job-name=finetune
#SBATCH --account={team}
#SBATCH --partition={pools}
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=10
#SBATCH --mem-per-cpu=8G
#SBATCH --gres=gpu:v100:1
#SBATCH --time=1:00:00
#SBATCH --get-user-env

srun python finetune.py
"""
NEMO_PREP = """#!/bin/bash
#SBATCH -J nemo-preprocess
#SBATCH -N 1
#SBATCH --tasks-per-node=4
#SBATCH --gpus-per-task=1
#SBATCH --exclude={avoid}
#SBATCH --overcommit
#SBATCH -t 30

srun python preprocess_data_for_megatron.py
"""


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, str]:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    pool = make_pool(server)
    return {
        "team": make_team(server),
        "pool": pool,
        "ib": machine(server, pool, features=["ib"]),
        "plain": machine(server, pool, features=[]),
    }


def submitted(server: Server, *args: str) -> dict[str, Any]:
    res = gpufleet("submit", "--hold", *args, env=server.env())
    assert res.returncode == 0, res.stderr
    with server.client() as c:
        return ok(c.get(f"/jobs/{res.stdout.split()[-1]}"))  # type: ignore[no-any-return]


def test_a_megatron_script_without_a_partition_gets_whole_ib_nodes_of_the_default_pool(
    server: Server, world: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "pretrain_gpt.sh"
    path.write_text(MEGATRON)
    with server.client() as c:
        ok(c.patch(f"/pools/{world['pool']}", json={"default": True}))
        try:
            job = submitted(server, "--team", world["team"], str(path))
        finally:  # the session's other tests submit without a pool
            ok(c.patch(f"/pools/{world['pool']}", json={"default": False}))
    assert job["pool"] == world["pool"]
    assert (job["gpus"], job["gpus_per_node"], job["nodes"]) == (16, 8, 2)
    assert (job["cpus_per_node"], job["mem_per_node_mb"]) == (224, BIG_MEM)  # the whole node, not 8 x 12


def test_a_csc_script_takes_the_first_pool_that_can_run_it_and_the_command_line_replaces_its_gres(
    server: Server, world: dict[str, str], tmp_path: Path
) -> None:
    small = make_pool(server)  # nodes of 1 GPU: this script's 2 GPUs cannot run there
    machine(server, small, gpus=1)
    path = tmp_path / "finetune.sh"
    path.write_text(CSC.format(team=world["team"], pools=f"{small},{world['pool']}"))
    refused = gpufleet("submit", "--hold", str(path), env=server.env())  # no V100 anywhere
    assert refused.returncode == 2 and "v100" in refused.stderr, refused.stderr
    job = submitted(server, "--gres", "gpu:2", str(path))  # the command line's --gres, whole
    assert (job["pool"], job["gpus"], job["gpu_type"], job["team"]) == (world["pool"], 2, None, world["team"])
    assert (job["cpus_per_node"], job["mem_per_node_mb"]) == (10, 10 * 8192)


def test_a_nemo_preprocessing_script_counts_gpus_per_task_and_keeps_off_excluded_nodes(
    server: Server, world: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "prep.sh"
    path.write_text(NEMO_PREP.format(avoid=world["ib"]))
    job = submitted(server, "--team", world["team"], "-p", world["pool"], str(path))
    assert (job["gpus"], job["gpus_per_node"], job["nodes"], job["name"]) == (4, 4, 1, "nemo-preprocess")
    with server.client() as c:
        ok(c.post(f"/jobs/{job['id']}/release"))
        got = ok(c.get(f"/jobs/{job['id']}"))
        for _ in range(200):  # 10 s at most
            if got["allocation"]:
                break
            time.sleep(0.05)
            got = ok(c.get(f"/jobs/{job['id']}"))
        ok(c.post("/jobs/cancel", json={"ids": [job["id"]]}))
    assert [a["node"] for a in got["allocation"]] == [world["plain"]], got["wait_reason"]


def test_no_gpu_is_asked_so_none_is_given(server: Server, world: dict[str, str]) -> None:
    job = submitted(server, "--team", world["team"], "-p", world["pool"], "-c", "2", "--", "true")
    assert job["gpus"] == 0 and job["cpus_per_node"] == 2
    label = unique("x")  # a feature no node has: Slurm's "Invalid feature specification"
    res = gpufleet(
        "submit", "--team", world["team"], "-p", world["pool"], "-C", label, "--", "true", env=server.env()
    )
    assert res.returncode == 2 and "invalid feature specification" in res.stderr, res.stderr


def test_admin_qos_and_a_script_that_names_one(server: Server, world: dict[str, str], tmp_path: Path) -> None:
    env = server.env()
    name = unique("high")
    made = gpufleet(
        "admin",
        "qos",
        "create",
        name,
        "--priority",
        "5",
        "--max-gpus-per-user",
        "4",
        "--no-preemptable",
        env=env,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"qos {name}: priority 5, max 4 GPUs and - jobs per user, not preemptable"
    listed = gpufleet("admin", "qos", "list", env=env).stdout.splitlines()
    assert any(line.split()[:5] == [name, "5", "4", "-", "no"] for line in listed), listed
    path = tmp_path / "q.sh"
    path.write_text(
        f"#!/bin/bash\n#SBATCH --qos={name}\n#SBATCH --gres=gpu:1\n#SBATCH -p {world['pool']}\ntrue\n"
    )
    assert submitted(server, "--team", world["team"], str(path))["qos"] == name
    gone = gpufleet("admin", "qos", "delete", name, env=env)
    assert gone.stdout.strip() == f"qos {name} deleted", gone.stderr
