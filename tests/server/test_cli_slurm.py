"""A Slurm user's commands against the real server (issue 18): strict scripts and the
flags of the same names, arrays (``Submitted batch job``, ``123_[1-3]`` in the queue,
cancelled whole or by task), dependencies, ``--export``, ``--account``, ``--exclusive``,
a CPU-only pool's default of no GPUs, ``cancel`` filters, ``requeue``, ``update`` and
``run`` (output, exit code, Ctrl-C). Nodes are played through the sync endpoint
(``playnode``) where a job has to run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from server.conftest import (
    Server,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    unique,
    wait_for,
)
from server.playnode import attempt_of, register, sync


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    return make_team(server)


def job(srv: Server, jid: int | str) -> Any:
    with srv.client() as c:
        return ok(c.get(f"/jobs/{jid}"))


def tasks(srv: Server, array: int) -> list[Any]:
    with srv.client() as c:
        return list(ok(c.get("/jobs", params={"array": array, "limit": 1000}))["items"])


def script(tmp_path: Path, name: str, *lines: str, body: str = "echo hi") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {x}\n" for x in lines) + body + "\n")
    return str(path)


def test_an_array_script_is_one_submit_shown_collapsed_and_cancelled_by_task_or_whole(
    server: Server, team: str, tmp_path: Path
) -> None:
    env = server.env()
    pool = make_pool(server)  # no nodes: every task waits
    path = script(
        tmp_path, "sweep.sh", "-J sweep", "--array=0-4", f"-p {pool}", "--time=30", "--mail-type=END"
    )
    sub = gpufleet("submit", "--team", team, path, env=env)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.startswith("Submitted batch job ")
    array = int(sub.stdout.split()[-1])
    got = tasks(server, array)
    assert [t["array_task_id"] for t in got] == [0, 1, 2, 3, 4]
    assert {(t["name"], t["time_limit_s"], t["gpus"]) for t in got} == {("sweep", 1800.0, 0)}  # none asked
    queue = gpufleet("queue", "--pool", pool, env=env).stdout.splitlines()
    assert [line.split()[0] for line in queue[1:]] == [f"{array}_[0-4]"]
    one = gpufleet("cancel", f"{array}_1", f"{array}_[3-4]", env=env)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [f"cancelled {array}_1", f"cancelled {array}_[3-4]"]
    queue = gpufleet("queue", "--pool", pool, env=env).stdout.splitlines()
    assert [line.split()[0] for line in queue[1:]] == [f"{array}_[0,2]"]
    held = gpufleet("hold", str(array), env=env)
    assert held.stdout.strip() == f"held array {array} (2 tasks)", held.stderr
    assert {t["state"] for t in tasks(server, array)} == {"HELD", "CANCELLED"}
    again = gpufleet("hold", str(array), env=env)
    assert again.returncode == 1 and "no task to hold (none is PENDING)" in again.stderr
    released = gpufleet("release", str(array), env=env)
    assert released.stdout.strip() == f"released array {array} (2 tasks)", released.stderr
    rest = gpufleet("cancel", str(array), env=env)
    assert rest.stdout.strip() == f"cancelled array {array} (2 tasks)", rest.stderr
    assert {t["state"] for t in tasks(server, array)} == {"CANCELLED"}
    again = gpufleet("cancel", str(array), f"{array}_9", env=env)
    assert again.returncode == 1
    assert f"array {array}: every task has ended" in again.stderr and f"no job {array}_9" in again.stderr
    parsable = gpufleet(
        "submit", "--parsable", "--team", team, "-p", pool, "-a", "1-2", "--", "true", env=env
    )
    assert parsable.stdout.strip().isdigit() and tasks(server, int(parsable.stdout))[0]["array_task_id"] == 1


def test_a_script_gpufleet_cannot_honour_is_refused_with_its_lines_unless_told(
    server: Server, team: str, tmp_path: Path
) -> None:
    env = server.env()
    pool = make_pool(server)
    path = script(tmp_path, "legacy.sh", "--gres=gpu:1", "--switches=1", "-w node7", f"-p {pool}")
    before = server.counts()
    res = gpufleet("submit", "--team", team, path, env=env)
    assert res.returncode == 2 and server.counts() == before
    assert res.stderr.splitlines() == [
        f"gpufleet: error: {path} line 3: #SBATCH --switches=1: gpufleet cannot honour this (placement keeps "
        "a multi-node job in one leaf when it can); remove it",
        f"gpufleet: error: {path} line 4: #SBATCH -w node7: gpufleet cannot honour this (no job is pinned to "
        "named nodes); gpufleet places jobs itself; use -p POOL, -C FEATURE or --exclude NODES to steer it",
        "gpufleet: error: nothing submitted; "
        "--ignore-unsupported submits without what gpufleet cannot honour",
    ]
    ok_ = gpufleet("submit", "--parsable", "--ignore-unsupported", "--team", team, path, env=env)
    assert ok_.returncode == 0, ok_.stderr
    assert ok_.stderr.count("(ignored: --ignore-unsupported)") == 2
    assert job(server, ok_.stdout.strip())["gpus_per_node"] == 1


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["nonexistent.sh"], "no script nonexistent.sh (no such file here)"),
        (["./missing/run"], "no script ./missing/run (no such file here)"),
        (["--time", "forever", "--", "true"], "--time=forever: cannot read duration 'forever'"),
        (["--gres", "gpu:a100:x", "--", "true"], "--gres=gpu:a100:x: expected gpu[:TYPE]:N"),
        (["--nodes", "x", "--", "true"], "--nodes=x: expected N or MIN-MAX nodes"),
        (["--mem", "lots", "--", "true"], "--mem=lots: expected a size such as 16G"),
        (
            ["-d", "afterok:999999999", "--", "true"],
            "--dependency=afterok:999999999: no job 999999999 of yours",
        ),
        (["--kill-on-invalid-dep", "sure", "--", "true"], "--kill-on-invalid-dep=sure: expected yes or no"),
    ],
    ids=["missing-script", "missing-path", "time", "gres", "nodes", "mem", "dependency", "yes-no"],
)
def test_bad_input_is_refused_before_anything_is_queued(
    server: Server, team: str, argv: list[str], words: str
) -> None:
    before = server.counts()
    res = gpufleet("submit", "--team", team, *argv, env=server.env())
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"gpufleet: error: {words}" or words in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and server.counts() == before


def test_a_dependency_in_a_script_and_the_flags_that_override_it(
    server: Server, team: str, tmp_path: Path
) -> None:
    env = server.env()
    pool = make_pool(server)
    first = int(gpufleet("submit", "--team", team, "-p", pool, "--", "true", env=env).stdout)
    path = script(tmp_path, "train.sh", "-J train", f"-d afterok:{first}", "--time=forever", f"-p {pool}")
    bad = gpufleet("submit", "--team", team, path, env=env)
    assert bad.returncode == 2 and f"{path} line 4: --time=forever" in bad.stderr
    sub = gpufleet(
        "submit",
        "--parsable",
        "--team",
        team,
        "--time",
        "1:00:00",
        "--kill-on-invalid-dep=yes",
        path,
        env=env,
    )
    assert sub.returncode == 0, sub.stderr  # the command line's --time replaces the script's
    dep = wait_for(server, int(sub.stdout), "PENDING")
    assert (dep["dependency"], dep["time_limit_s"], dep["name"]) == (f"afterok:{first}", 3600.0, "train")
    bad_dep = script(tmp_path, "other.sh", "-d afterok:999999999", f"-p {pool}")
    res = gpufleet("submit", "--team", team, bad_dep, env=env)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"gpufleet: error: {bad_dep} line 2: #SBATCH -d afterok:999999999: no job 999999999 of yours"
    )
    gpufleet("cancel", str(first), env=env)
    wait_for(server, int(sub.stdout), "CANCELLED")  # kill_on_invalid_dep


def test_export_account_cpu_pool_and_exclusive(server: Server, team: str, tmp_path: Path) -> None:
    env = server.env() | {"MY_SETTING": "42", "HF_TOKEN": "hf_secret", "SSH_AUTH_SOCK": "/tmp/agent"}
    cpu = make_pool(server, gpu=False)
    sub = gpufleet("submit", "-A", team, "-p", cpu, "-c", "4", "--mem", "8G", "--", "true", env=env)
    assert sub.returncode == 0, sub.stderr
    j = job(server, sub.stdout.strip())
    assert (j["team"], j["gpus"], j["cpus_per_node"], j["mem_per_node_mb"]) == (team, 0, 4, 8192)
    assert j["env"]["MY_SETTING"] == "42" and j["submit_dir"]
    assert not {"HF_TOKEN", "SSH_AUTH_SOCK", "GPUFLEET_TOKEN", "GPUFLEET_URL"} & set(j["env"])
    none = gpufleet("submit", "-A", team, "-p", cpu, "--export", "NONE,ONLY=1", "--", "true", env=env)
    assert job(server, none.stdout.strip())["env"] == {"ONLY": "1"}
    user = make_user(server, team=team)
    res = gpufleet("submit", "-A", "not-mine", "-p", cpu, "--", "true", env=server.env(user))
    assert res.returncode == 2
    assert "--account=not-mine: gpufleet cannot honour this (not-mine is not one of your teams" in res.stderr
    gpu = make_pool(server)
    make_node(server, pool=gpu, gpus=8)
    make_node(server, pool=gpu, gpus=8)
    whole = gpufleet("submit", "--team", team, "-p", gpu, "-N", "2", "--exclusive", "--", "true", env=env)
    assert whole.returncode == 0, whole.stderr
    j = job(server, whole.stdout.strip())
    assert (j["gpus"], j["gpus_per_node"], j["nodes"]) == (16, 8, 2)
    half = gpufleet(
        "submit", "--team", team, "-p", gpu, "--gres", "gpu:4", "--exclusive", "--", "true", env=env
    )
    assert half.returncode == 2 and "ask for gpus_per_node=8 (--gres=gpu:8)" in half.stderr
    shared = gpufleet("submit", "--team", team, "-p", cpu, "--exclusive", "--", "true", env=env)
    assert shared.returncode == 2 and "has no nodes to take whole" in shared.stderr  # (the pool has none)
    gpufleet("cancel", whole.stdout.strip(), env=env)


def test_cancel_filters(server: Server, team: str) -> None:
    env = server.env()
    pool = make_pool(server)
    who = unique("bob")
    mine = server.env(make_user(server, team=team, name=who))
    name = unique("sweep")
    ids = [int(gpufleet("submit", "-p", pool, "-J", name, "--", "true", env=mine).stdout) for _ in range(2)]
    other = int(gpufleet("submit", "-p", pool, "-J", "keep", "--", "true", env=mine).stdout)
    gpufleet("hold", str(ids[1]), env=mine)
    held = gpufleet("cancel", "--name", name, "--state", "PD", env=mine)
    assert held.stdout.strip() == f"cancelled 2 jobs: {ids[0]} {ids[1]}", held.stderr
    assert job(server, other)["state"] == "PENDING"
    assert gpufleet("cancel", "--user", "admin", env=mine).returncode == 1  # others' jobs: operators
    everything = gpufleet("cancel", "--user", who, "--state", "PENDING,HELD", env=env)  # an operator
    assert everything.stdout.strip() == f"cancelled 1 job: {other}"
    assert gpufleet("cancel", env=mine).returncode == 2


def test_requeue_and_update(server: Server, team: str) -> None:
    env = server.env()
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=1)
    jid = int(gpufleet("submit", "--team", team, "-p", pool, "-t", "2h", "--", "sleep", "60", env=env).stdout)
    placed = wait_for(server, jid, "SCHEDULED")
    sync(
        server,
        node,
        {"jobs": [{"job_id": jid, "state": "running", "attempt": attempt_of(placed)}]},
        token=token,
    )
    wait_for(server, jid, "RUNNING")
    re = gpufleet("requeue", str(jid), env=env)
    assert re.returncode == 0 and re.stdout.startswith(f"requeued {jid} (PENDING)"), re.stderr
    events = job(server, jid)["events"]
    assert [e["to_state"] for e in events[-2:]] == ["REQUEUED", "PENDING"] and events[-1]["actor"] == "admin"
    assert job(server, jid)["attempts"] == 0
    again = gpufleet("requeue", str(jid), env=env)
    assert again.returncode == 1 and "nothing to requeue" in again.stderr
    user = make_user(server, team=team)
    mine = int(
        gpufleet("submit", "-p", make_pool(server), "-t", "2h", "--", "true", env=server.env(user)).stdout
    )
    down = gpufleet(
        "update", str(mine), "--time-limit", "30", "--name", "shorter", "--hold", env=server.env(user)
    )
    assert down.stdout.strip() == f"updated {mine}: HELD, name shorter, time limit 30m00s", down.stderr
    up = gpufleet("update", str(mine), "-t", "3h", env=server.env(user))
    assert up.returncode == 1 and "a time limit only goes down" in up.stderr
    assert gpufleet("update", str(mine), "-t", "3h", "--release", env=env).stdout.strip() == (
        f"updated {mine}: PENDING, name shorter, time limit 3h00m"
    )
    assert gpufleet("update", "999999999", "--name", "x", env=env).stderr.strip() == (
        "gpufleet: error: not found: no job 999999999"
    )
    gpufleet("cancel", str(mine), env=env)
    ended = gpufleet("requeue", str(mine), env=env)
    assert ended.returncode == 1 and "has ended (CANCELLED)" in ended.stderr


def test_run_prints_the_output_and_exits_with_the_jobs_code(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=1)
    argv = [sys.executable, "-m", "gpufleet", "run", "--team", team, "-p", pool, "--", "python", "x.py"]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(server)
    ) as p:
        jid = _queued(server, pool)
        placed = wait_for(server, jid, "SCHEDULED")
        attempt = attempt_of(placed)
        text = "step 1\nstep 2\n"
        running = {"job_id": jid, "state": "running", "attempt": attempt}
        log = {"job_id": jid, "attempt": attempt, "offset": 0, "end": len(text), "data": text}
        sync(server, node, {"jobs": [running], "logs": [log]}, token=token)
        exited = {"job_id": jid, "state": "exited", "attempt": attempt, "exit_code": 3}
        sync(server, node, {"jobs": [exited]}, token=token)
        out, err = p.communicate(timeout=30)
    assert (p.returncode, out) == (3, text), err
    assert f"gpufleet: job {jid} queued" in err


def test_ctrl_c_cancels_the_run_and_waits_for_it(server: Server, team: str) -> None:
    pool = make_pool(server)  # no node: the job waits
    argv = [sys.executable, "-m", "gpufleet", "run", "--team", team, "-p", pool, "--", "true"]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(server)
    ) as p:
        jid = _queued(server, pool)
        time.sleep(0.5)  # streaming
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 1, err
    assert f"cancelling job {jid} (Ctrl-C again to stop waiting)" in err
    assert f"gpufleet: error: job {jid} was cancelled (CANCELLED)" in err
    assert job(server, jid)["state"] == "CANCELLED"


def _env(srv: Server) -> dict[str, str]:
    import os

    return {**os.environ, **srv.env()}


def _queued(srv: Server, pool: str, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    with srv.client() as c:
        while True:
            items = ok(c.get("/jobs", params={"pool": pool}))["items"]
            if items:
                return int(items[-1]["id"])
            assert time.monotonic() < deadline, "gpufleet run submitted nothing"
            time.sleep(0.05)
