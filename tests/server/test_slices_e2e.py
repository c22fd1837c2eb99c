"""A MIG slice and a GPU share end to end (issue 17): a real agent process on simulated
GPUs, GPU 1 in MIG mode cut in two 3g.40gb instances, GPU 0 shared by an operator through
the CLI; one job asks ``--mig 3g.40gb``, one ``--gpu-fraction 0.5``, both submitted through
the CLI and run by the agent as the job account. Each job prints what CUDA would see: the
slice's ``MIG-...`` UUID; the shared GPU with MPS's limits (half its SMs, half its memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobaccounts import JOB_ACCOUNT, ensure_account, passable, user_map_file
from server.conftest import Server, gpufleet, make_pool, make_team, ok, unique, wait_for

PRINT = 'echo "$CUDA_VISIBLE_DEVICES|$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"'


def test_a_job_on_a_mig_slice_and_one_on_a_share(server: Server, tmp_path: Path) -> None:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the agent and CLI are clients of the API: their tests run once, on SQLite")
    ensure_account(JOB_ACCOUNT)
    passable(tmp_path)
    pool, team, node = make_pool(server), make_team(server), unique("mig")
    env = server.env()
    assert gpufleet("node", "register", node, "--pool", pool, env=env).returncode == 0
    token = tmp_path / "node.token"
    token.write_text(gpufleet("node", "join-token", "--node", node, env=env).stdout)
    token.chmod(0o600)
    args = ["agent", "--server", server.url, "--token-file", str(token), "--name", node]
    args += ["--simulate-gpus", "2", "--simulate-mig", "1=3g.40gb,3g.40gb", "--sync-interval", "1s"]
    args += [
        "--work-dir",
        str(tmp_path / "w"),
        "--user-map",
        str(user_map_file(tmp_path)),
        "--address",
        "127.0.0.1",
    ]
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", *args],
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")},
    )
    try:
        with server.client() as c:
            deadline = time.monotonic() + 30
            while not [g for g in ok(c.get(f"/nodes/{node}"))["gpus"] if g.get("mig_instances")]:
                assert time.monotonic() < deadline, "the agent did not report its MIG instances"
                time.sleep(0.1)
            uuids = {m["start"]: m["uuid"] for m in ok(c.get(f"/nodes/{node}"))["gpus"][1]["mig_instances"]}
        shared = gpufleet("node", "share", node, "--gpu", "0", env=env)
        assert shared.returncode == 0 and "shared" in shared.stdout, shared.stderr
        ids = []
        for flags in (["--mig", "3g.40gb"], ["--gpu-fraction", "0.5"]):
            done = gpufleet(
                "submit", "--parsable", "-p", pool, "-A", team, *flags, "--", "sh", "-c", PRINT, env=env
            )
            assert done.returncode == 0, done.stderr
            ids.append(int(done.stdout.strip()))
        for i in ids:
            wait_for(server, i, "COMPLETED", timeout=30)
        with server.client() as c:
            on_slice, on_share = (c.get(f"/jobs/{i}/logs").text.strip() for i in ids)
        assert on_slice in {f"{u}||" for u in uuids.values()}, on_slice
        assert on_share == "0|50|0=40779M", on_share  # 50 % of a simulated H100-80GB's 81,559 MiB
    finally:
        agent.terminate()
        agent.wait(10)
