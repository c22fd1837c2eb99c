"""The Slurm commands a job calls (issue 31), black-box against a real server: ``sbatch``,
``squeue``, ``scontrol``, ``scancel``, ``sacct`` and ``sinfo`` as ``python -m
gpufleet.slurm NAME`` (what the launchers run), their exact output formats and exit
codes, another user's job refused as Slurm refuses a job that is not there, and
``gpufleet slurm install`` refusing to write over what is not its own. A 2-node job runs
on nodes played through the sync endpoint (``playnode``). The commands are clients of
the API: run once, on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from server.conftest import Server, gpufleet, make_pool, make_team, make_user, ok, unique, wait_for
from server.playnode import attempt_of, register, sync


def slurm(
    name: str, *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.slurm", name, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        cwd=cwd,
        check=False,
    )


def job(srv: Server, jid: int) -> Any:
    with srv.client() as c:
        return ok(c.get(f"/jobs/{jid}"))


@pytest.fixture(scope="module")
def fleet(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A team, a pool of two 2-GPU nodes (``PREFIXn1``, ``PREFIXn2``), a user of the team
    and another, and a running 2-node job submitted with ``sbatch``."""
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the Slurm commands are clients of the API: their tests run once, on SQLite")
    team = make_team(server)
    pool = make_pool(server)
    prefix = unique("sl")
    tokens = {n: register(server, pool=pool, gpus=2, name=f"{prefix}n{n}")[1] for n in (1, 2)}
    alice, bob = unique("alice"), unique("bob")
    env = server.env(make_user(server, team=team, name=alice))
    other = server.env(make_user(server, team=team, name=bob))
    work = tmp_path_factory.mktemp("slurm")
    (work / "train.sh").write_text(
        f"#!/bin/bash\n#SBATCH -J sltrain\n#SBATCH -N 2\n#SBATCH --gres=gpu:2\n#SBATCH -p {pool}\n"
        "#SBATCH -t 1:00:00\n#SBATCH -o logs/%x-%j.out\nsrun hostname\n"
    )
    sub = slurm("sbatch", "train.sh", env=env, cwd=work)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.startswith("Submitted batch job ") and len(sub.stdout.split()) == 4, sub.stdout
    jid = int(sub.stdout.split()[3])
    placed = wait_for(server, jid, "SCHEDULED")
    for n, token in tokens.items():
        running = {"job_id": jid, "state": "running", "attempt": attempt_of(placed)}
        sync(server, f"{prefix}n{n}", {"jobs": [running]}, token=token)
    wait_for(server, jid, "RUNNING")
    return {
        "team": team,
        "pool": pool,
        "prefix": prefix,
        "env": env,
        "other": other,
        "alice": alice,
        "work": work,
        "job": jid,
    }


def test_squeue_formats(fleet: dict[str, Any]) -> None:
    env, jid, prefix = fleet["env"], fleet["job"], fleet["prefix"]
    out = slurm("squeue", "-h", "-o", "%i %j %T %t %D %N %P %b %l", "-j", str(jid), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{jid} sltrain RUNNING R 2 {prefix}n[1-2] {fleet['pool']} gres/gpu:2 1:00:00\n"
    default = slurm("squeue", "-p", fleet["pool"], env=env).stdout.splitlines()
    assert (
        default[0] == "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
    )
    row = default[1].split()
    assert (row[0], row[2], row[4], row[6], row[7]) == (str(jid), "sltrain", "R", "2", f"{prefix}n[1-2]")
    mine = slurm("squeue", "--me", "-h", "-o", "%.8i|%u", env=env).stdout.splitlines()
    assert f"{jid:>8}|{fleet['alice'][:8]}"[: 8 + 1 + 8] in [line[:17] for line in mine]
    none = slurm("squeue", "-h", "-t", "CD", "-j", str(jid), env=env)
    assert none.returncode == 0 and none.stdout == ""
    bad = slurm("squeue", "-t", "NOPE", env=env)
    assert bad.returncode == 1 and bad.stderr == "squeue: error: Invalid job state specified: NOPE\n"


def test_scontrol_show_job_and_node(fleet: dict[str, Any]) -> None:
    env, jid, prefix = fleet["env"], fleet["job"], fleet["prefix"]
    shown = slurm("scontrol", "show", "job", str(jid), env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"JobId={jid} JobName=sltrain"
    fields = dict(kv.split("=", 1) for line in lines[1:] for kv in line.split() if "=" in kv)
    assert fields["JobState"] == "RUNNING" and fields["NodeList"] == f"{prefix}n[1-2]"
    assert fields["BatchHost"] == f"{prefix}n1" and fields["NumNodes"] == "2"
    assert fields["Partition"] == fleet["pool"] and fields["TimeLimit"] == "01:00:00"
    assert fields["StdOut"] == f"{fleet['work']}/logs/sltrain-{jid}.out" and fields["Command"] == "train.sh"
    assert all(line.startswith("   ") for line in lines[1:-1]) and lines[-1] == ""
    one = slurm("scontrol", "-o", "show", "job", str(jid), env=env).stdout.splitlines()
    assert len(one) == 1 and one[0].startswith(f"JobId={jid} JobName=sltrain UserId=")
    hosts = slurm("scontrol", "show", "hostnames", fields["NodeList"], env={})
    assert hosts.stdout.splitlines() == [f"{prefix}n1", f"{prefix}n2"]
    node = slurm("scontrol", "show", "node", f"{prefix}n2", env=env)
    assert node.stdout.startswith(f"NodeName={prefix}n2 ") and "State=ALLOCATED" in node.stdout
    missing = slurm("scontrol", "show", "node", "nosuchnode", env=env)
    assert missing.returncode == 1 and missing.stderr == "scontrol: error: Node nosuchnode not found\n"
    for gone in ("999999999", "x1"):
        res = slurm("scontrol", "show", "job", gone, env=env)
        assert res.returncode == 1 and res.stderr == "scontrol: error: Invalid job id specified\n"


def test_another_users_job_is_not_there_for_them(server: Server, fleet: dict[str, Any]) -> None:
    other, jid = fleet["other"], str(fleet["job"])
    res = slurm("scontrol", "show", "job", jid, env=other)
    assert res.returncode == 1 and res.stderr == "scontrol: error: Invalid job id specified\n"
    upd = slurm("scontrol", "update", f"JobId={jid}", "TimeLimit=5", env=other)
    assert upd.returncode == 1 and upd.stderr == "slurm_update error: Invalid job id specified\n"
    req = slurm("scontrol", "requeue", jid, env=other)
    assert (
        req.returncode == 1
        and req.stderr == f"Requeue of JobId={jid} returned an error: Invalid job id specified\n"
    )
    can = slurm("scancel", jid, env=other)
    assert can.returncode == 1
    assert can.stderr == f"scancel: error: Kill job error on job id {jid}: Invalid job id specified\n"
    assert slurm("squeue", "-h", "-j", jid, env=other).stdout == ""
    after = job(server, fleet["job"])
    assert (after["state"], after["time_limit_s"]) == ("RUNNING", 3600.0)


def test_update_requeue_hold_release_cancel_and_sacct(server: Server, fleet: dict[str, Any]) -> None:
    env, jid = fleet["env"], fleet["job"]
    upd = slurm("scontrol", "update", f"JobId={jid}", "TimeLimit=30:00", "JobName=renamed", env=env)
    assert (upd.returncode, upd.stdout, upd.stderr) == (0, "", "")
    assert (job(server, jid)["time_limit_s"], job(server, jid)["name"]) == (1800.0, "renamed")
    bad = slurm("scontrol", "update", f"JobId={jid}", "Partition=x", env=env)
    assert bad.returncode == 1 and "not supported: partition=x" in bad.stderr
    assert slurm("scontrol", "requeue", str(jid), env=env).returncode == 0
    assert job(server, jid)["state"] in ("PENDING", "SCHEDULED")
    # a second job waits behind it in a pool of no nodes, to hold and release
    waiting = slurm(
        "sbatch",
        "--parsable",
        "-p",
        make_pool(server),
        "--gres=gpu:1",
        "train.sh",
        env=env,
        cwd=fleet["work"],
    )
    wid = waiting.stdout.strip()
    assert waiting.returncode == 0 and wid.isdigit(), waiting.stderr
    assert slurm("scontrol", "hold", wid, env=env).returncode == 0
    held = slurm("squeue", "-h", "-j", wid, "-o", "%t %r %R", env=env).stdout
    assert held == "PD JobHeldUser (JobHeldUser)\n"
    assert slurm("scontrol", "release", wid, env=env).returncode == 0
    assert job(server, int(wid))["state"] == "PENDING"
    dep = slurm(
        "sbatch",
        f"--dependency=afterany:{wid}",
        "-p",
        make_pool(server),
        "train.sh",
        env=env,
        cwd=fleet["work"],
    )
    assert dep.returncode == 0 and dep.stdout.startswith("Submitted batch job "), dep.stderr
    did = int(dep.stdout.split()[3])
    assert job(server, did)["dependency"] == f"afterany:{wid}"
    cancel = slurm("scancel", wid, str(did), str(jid), env=env)
    assert (cancel.returncode, cancel.stdout, cancel.stderr) == (0, "", "")
    assert {job(server, int(i))["state"] for i in (wid, did, jid)} == {"CANCELLED"}
    again = slurm("scancel", wid, env=env)
    assert again.returncode == 1
    assert (
        again.stderr
        == f"scancel: error: Kill job error on job id {wid}: Job/step already completing or completed\n"
    )
    assert slurm("scancel", env=env).stderr == "scancel: error: No job identification provided\n"
    acct = slurm("sacct", "-j", f"{jid},{wid}", "-X", "-P", "-n", "-o", "JobID,JobName,State", env=env)
    assert acct.returncode == 0, acct.stderr
    assert acct.stdout.splitlines() == [f"{jid}|renamed|CANCELLED", f"{wid}|sltrain|CANCELLED"]


def test_sbatch_wrap_and_standard_input(server: Server, fleet: dict[str, Any]) -> None:
    env, pool = fleet["env"], make_pool(server)
    wrap = slurm("sbatch", "-p", pool, "--gres=gpu:1", "--wrap", "python train.py --lr 3e-4", env=env)
    assert wrap.returncode == 0 and wrap.stdout.startswith("Submitted batch job "), wrap.stderr
    wrapped = job(server, int(wrap.stdout.split()[3]))
    assert (wrapped["name"], wrapped["command"][2]) == ("wrap", "#!/bin/sh\npython train.py --lr 3e-4\n")
    text = (fleet["work"] / "train.sh").read_text()
    piped = subprocess.run(
        [sys.executable, "-m", "gpufleet.slurm", "sbatch", "--parsable", "-p", pool],
        input=text, capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert piped.returncode == 0 and piped.stdout.strip().isdigit(), piped.stderr
    read = job(server, int(piped.stdout))
    assert (read["name"], read["command"][2], read["nodes"]) == ("sltrain", text, 2)  # its #SBATCH -J
    empty = subprocess.run(
        [sys.executable, "-m", "gpufleet.slurm", "sbatch", "-p", pool],
        input="", capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert (empty.returncode, empty.stderr) == (1, "sbatch: error: Batch script is empty!\n")
    slurm("scancel", "-p", pool, env=env)


def test_scancel_filters(server: Server, fleet: dict[str, Any]) -> None:
    env, pool = fleet["env"], make_pool(server)
    name = unique("sweep")
    ids = [
        slurm(
            "sbatch", "--parsable", "-p", pool, "-J", name, "train.sh", env=env, cwd=fleet["work"]
        ).stdout.strip()
        for _ in range(2)
    ]
    keep = slurm(
        "sbatch", "--parsable", "-p", pool, "-J", "keep", "train.sh", env=env, cwd=fleet["work"]
    ).stdout.strip()
    res = slurm("scancel", "-n", name, "-t", "PD", env=env)
    assert res.returncode == 0, res.stderr
    assert [job(server, int(i))["state"] for i in (*ids, keep)] == ["CANCELLED", "CANCELLED", "PENDING"]
    assert slurm("scancel", "-p", pool, env=env).returncode == 0
    assert job(server, int(keep))["state"] == "CANCELLED"


def test_sinfo(fleet: dict[str, Any]) -> None:
    env, pool, prefix = fleet["env"], fleet["pool"], fleet["prefix"]
    out = slurm("sinfo", "-p", pool, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
    assert len(lines) == 2, lines  # both nodes in one state: idle, alloc, or down once unheard of
    assert lines[1].split()[:4] == [fleet["pool"], "up", "infinite", "2"]
    assert lines[1].split()[4:] in (
        ["alloc", f"{prefix}n[1-2]"],
        ["idle", f"{prefix}n[1-2]"],
        ["down", f"{prefix}n[1-2]"],
    )
    nodes = slurm("sinfo", "-N", "-h", "-p", pool, "-o", "%N %c %G", env=env).stdout.splitlines()
    assert nodes == [f"{prefix}n1 0 gpu:h100:2", f"{prefix}n2 0 gpu:h100:2"]


def test_fast_commands_import_no_models_nor_scheduler(fleet: dict[str, Any]) -> None:
    """Issue 31's fast CLI: ``jobs show`` and ``nodes`` print the server's JSON (no
    pydantic), ``submit`` matches GPU models for its price hint without the scheduling
    core (``gpumatch``), prices set or not."""
    env = fleet["env"]

    def imported(*argv: str) -> set[str]:
        done = gpufleet("-X", "importtime", "-m", "gpufleet", *argv, env=env, python_flags=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return {
            line.split("|")[-1].strip()
            for line in done.stderr.splitlines()
            if line.startswith("import time:")
        }

    for argv in (("jobs", "show", str(fleet["job"])), ("nodes",), ("nodes", "--json")):
        modules = imported(*argv)
        assert not any(m.split(".")[0] in ("pydantic", "pydantic_core") for m in modules), argv
    submit = imported("submit", "--parsable", "-p", fleet["pool"], "--gres=gpu:1", "-t", "5", "--", "true")
    assert not any(m.startswith("gpufleet.scheduler") for m in submit)
    shown = gpufleet("jobs", "show", str(fleet["job"]), env=env).stdout
    assert f"{fleet['prefix']}n1:0-1" in shown and "events:" in shown


def test_slurm_install_writes_only_its_own(tmp_path: Path) -> None:
    where = tmp_path / "bin"
    first = gpufleet("slurm", "install", str(where))
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in where.iterdir()) == sorted(
        ("srun", "scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo")
    )
    assert f'export PATH="{where}:$PATH"' in first.stdout
    hosts = subprocess.run(
        [str(where / "scontrol"), "show", "hostnames", "x[1-2]"], capture_output=True, text=True, check=False
    )
    assert hosts.stdout == "x1\nx2\n"
    assert "up to date" in gpufleet("slurm", "install", str(where)).stdout
    real = where / "squeue"
    real.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 64)  # a real Slurm binary
    (where / "sinfo").unlink()
    refused = gpufleet("slurm", "install", "--force", str(where))
    assert refused.returncode == 1 and f"{real}" in refused.stderr and "nothing written" in refused.stderr
    assert real.read_bytes().startswith(b"\x7fELF") and not (where / "sinfo").exists()


def _states(srv: Server, array: int) -> dict[str, int]:
    with srv.client() as c:
        items = ok(c.get("/jobs", params={"array": array}))["items"]
    return {st: sum(1 for j in items if j["state"] == st) for st in {j["state"] for j in items}}


def test_squeue_folds_a_waiting_array_and_r_shows_each_task(server: Server, fleet: dict[str, Any]) -> None:
    """Slurm's default: an array's waiting tasks are one line, ``123_[0-2,4]`` (the
    server folds them); ``-r`` one line a task; ``scontrol hold|release`` and ``scancel``
    of the array's id act on all its tasks."""
    env, pool = fleet["env"], make_pool(server)  # no node: every task waits
    sub = slurm("sbatch", "--parsable", "-H", "-p", pool, "-a", "0-4", "--wrap", "true", env=env)
    assert sub.returncode == 0, sub.stderr
    array = int(sub.stdout.strip())
    held = slurm("squeue", "-h", "-p", pool, "-o", "%r", env=env).stdout
    assert held == "JobHeldUser\n"  # submitted held: Slurm's reason, as after scontrol hold
    one = slurm("scancel", f"{array}_3", env=env)
    assert one.returncode == 0, one.stderr
    folded = slurm("squeue", "-h", "-p", pool, "-o", "%i %A %a %t", env=env).stdout
    assert folded == f"{array}_[0-2,4] {array} [0-2,4] PD\n"
    each = slurm("squeue", "-h", "-r", "-p", pool, "-o", "%i", env=env).stdout.split()
    assert each == [f"{array}_{t}" for t in (0, 1, 2, 4)]
    assert slurm("scontrol", "release", str(array), env=env).returncode == 0  # every task
    assert _states(server, array) == {"PENDING": 4, "CANCELLED": 1}
    assert slurm("scontrol", "hold", str(array), env=env).returncode == 0
    assert _states(server, array) == {"HELD": 4, "CANCELLED": 1}
    renamed = slurm("scontrol", "update", f"JobId={array}", "JobName=swept", env=env)
    assert renamed.returncode == 0, renamed.stderr
    with server.client() as c:
        names = {
            j["name"] for j in ok(c.get("/jobs", params={"array": array}))["items"] if j["state"] == "HELD"
        }
    assert names == {"swept"}
    assert slurm("scancel", str(array), env=env).returncode == 0
    assert slurm("squeue", "-h", "-p", pool, env=env).stdout == ""
