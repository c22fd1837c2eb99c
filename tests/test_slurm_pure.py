"""The Slurm commands' pure parts (issue 31): hostlists both ways, squeue's and sinfo's
formats, scontrol's records, the launchers, and what ``scontrol show hostnames`` (run at
every task start) imports: no client, no Typer, no pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.slurm import hostlist, launchers, scontrol, sinfo, squeue
from gpufleet.slurm._common import SlurmError, clock_time, elapsed, wanted_states


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node-[001-003,007]", ["node-001", "node-002", "node-003", "node-007"]),
        ("gpu1", ["gpu1"]),
        ("a,b", ["a", "b"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x[1,3],y,z[05-06]-ib", ["x1", "x3", "y", "z05-ib", "z06-ib"]),
        (" n[1-2] ", ["n1", "n2"]),
    ],
    ids=["padded-ranges", "one", "plain-list", "unpadded", "padded", "two-brackets", "mixed", "spaces"],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert hostlist.expand(text) == hosts


@pytest.mark.parametrize(
    "text",
    ["n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[[1]]", "n[0-99999999]"],
    ids=["open", "backwards-brackets", "letters", "down", "nested", "too-many"],
)
def test_expand_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        hostlist.expand(text)


@pytest.mark.parametrize(
    ("hosts", "text"),
    [
        (["node-001", "node-002", "node-003", "node-007"], "node-[001-003,007]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n1"], "n1"),
        (["b1", "a1", "b2"], "b1,a1,b2"),
        (["login", "n1", "n2"], "login,n[1-2]"),
        (["n07", "n08", "n9"], "n[07-08],n9"),
        ([], ""),
    ],
    ids=["padded", "unpadded", "one", "order-kept", "no-number", "widths-differ", "none"],
)
def test_compress(hosts: list[str], text: str) -> None:
    assert hostlist.compress(hosts) == text
    if hosts:
        assert hostlist.expand(text) == hosts


@pytest.mark.parametrize(
    ("seconds", "squeue_time", "scontrol_time"),
    [
        (0, "0:00", "00:00:00"),
        (65, "1:05", "00:01:05"),
        (3600, "1:00:00", "01:00:00"),
        (90061, "1-01:01:01", "1-01:01:01"),
        (None, "UNLIMITED", "UNLIMITED"),
    ],
)
def test_times(seconds: float | None, squeue_time: str, scontrol_time: str) -> None:
    assert elapsed(seconds) == squeue_time and clock_time(seconds) == scontrol_time


def test_states() -> None:
    assert wanted_states(["PD", "r"]) == ["PENDING", "HELD", "SCHEDULED", "RUNNING"]
    assert wanted_states(["COMPLETED,CA"]) == ["COMPLETED", "CANCELLED"]
    assert wanted_states(["SUSPENDED"]) == []
    assert "TIMEOUT" in wanted_states(["all"])
    with pytest.raises(SlurmError, match="Invalid job state specified: XX"):
        wanted_states(["XX"])


def job(**over: Any) -> dict[str, Any]:
    """A job as ``GET /v1/jobs`` lists it (the fields the commands read)."""
    base: dict[str, Any] = {
        "id": 42,
        "name": "train",
        "user": "alice",
        "team": "ml",
        "pool": "gpu",
        "state": "RUNNING",
        "gpus": 16,
        "gpus_per_node": 8,
        "nodes": 2,
        "priority": 10,
        "time_limit_s": 7200.0,
        "command": ["bash", "-c", "#!/bin/bash\nsrun hostname\n", "train.sh"],
        "submit_time": 1000.0,
        "scheduled_at": 1010.0,
        "started_at": 1012.0,
        "ended_at": None,
        "exit_code": None,
        "attempts": 0,
        "allocation": [
            {"node": "node-001", "gpus": list(range(8))},
            {"node": "node-002", "gpus": list(range(8))},
        ],
        "cpus_per_node": 32,
        "mem_per_node_mb": 65536,
        "output": "logs/%x-%j.out",
        "submit_dir": "/home/alice/run",
        "wait_reason": None,
    }
    return base | over


def test_squeue_default_format_and_letters() -> None:
    cols, tail = squeue.parse_format(squeue.DEFAULT_FORMAT)
    pending = job(
        id=43,
        state="HELD",
        allocation=[],
        started_at=None,
        scheduled_at=None,
        wait_reason="JobHeldUser: by alice",
    )
    lines = squeue.render([job(), pending], cols, tail, header=True, now=1012.0 + 3725)
    assert lines == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "                42       gpu    train    alice  R    1:02:05      2 node-[001-002]",
        "                43       gpu    train    alice PD       0:00      2 (JobHeldUser)",
    ]
    cols, tail = squeue.parse_format("%i|%-6j|%T|%l|%D|%N|%C|%b|%P|%u|%%")
    array_task = job(id=50, array_job_id=44, array_task_id=3, name="a-long-name")
    assert squeue.render([array_task], cols, tail, header=False, now=2000.0) == [
        "44_3|a-long|RUNNING|2:00:00|2|node-[001-002]|64|gres/gpu:8|gpu|alice|%"
    ]
    cols, tail = squeue.parse_long_format("jobid:6,state:.9")
    assert squeue.render([job()], cols, tail, header=True, now=2000.0) == [
        "JOBID      STATE",
        "42       RUNNING",
    ]
    with pytest.raises(SlurmError, match="Invalid job format specification: y"):
        squeue.parse_format("%i %y")


def test_scontrol_job_record() -> None:
    record = scontrol.job_record(job(), now=1012.0 + 62)
    fields = {k: v for line in record for k, v in line}
    assert fields["JobId"] == 42 and fields["JobName"] == "train"
    assert fields["JobState"] == "RUNNING" and fields["NodeList"] == "node-[001-002]"
    assert fields["BatchHost"] == "node-001" and fields["NumNodes"] == 2 and fields["NumCPUs"] == 64
    assert fields["RunTime"] == "00:01:02" and fields["TimeLimit"] == "02:00:00"
    assert fields["TRES"] == "cpu=64,mem=131072M,node=2,gres/gpu=16"
    assert fields["StdOut"] == "/home/alice/run/logs/train-42.out" and fields["Command"] == "train.sh"
    assert fields["WorkDir"] == "/home/alice/run" and fields["BatchFlag"] == 1
    waiting = {
        k: v
        for line in scontrol.job_record(
            job(state="PENDING", allocation=[], wait_reason="Priority: 3 ahead"), now=0
        )
        for k, v in line
    }
    assert (waiting["JobState"], waiting["Reason"], waiting["NodeList"]) == ("PENDING", "Priority", None)


def test_scontrol_node_states() -> None:
    node = {"name": "n1", "state": "Ready", "gpus_total": 8, "gpus_used": 0, "pool": "gpu", "model": "H100"}
    assert scontrol.node_state(node) == "IDLE"
    assert scontrol.node_state(node | {"gpus_used": 3}) == "MIXED"
    assert scontrol.node_state(node | {"gpus_used": 8}) == "ALLOCATED"
    assert scontrol.node_state(node | {"cordoned": True}) == "DRAIN"
    assert scontrol.node_state(node | {"draining": True, "gpus_used": 2}) == "DRAINING"
    assert scontrol.node_state(node | {"state": "NotReady"}) == "DOWN"


def test_sinfo_groups_nodes_by_state() -> None:
    pools: list[dict[str, Any]] = [{"name": "gpu", "default": True}, {"name": "cpu"}]
    ready = {"state": "Ready", "gpus_total": 8, "pool": "gpu", "model": "H100"}
    nodes = [
        ready | {"name": "g01", "gpus_used": 0},
        ready | {"name": "g02", "gpus_used": 0},
        ready | {"name": "g03", "gpus_used": 8},
    ]
    table = sinfo.rows(pools, nodes, sinfo.DEFAULT, per_node=False)
    assert sinfo.render(table, sinfo.DEFAULT, header=True) == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "gpu*         up   infinite      2   idle g[01-02]",
        "gpu*         up   infinite      1  alloc g03",
        "cpu          up   infinite      0    n/a",
    ]
    table = sinfo.rows(pools, nodes, "%P %F", per_node=False)
    assert sinfo.render(table, "%P %F", header=False) == ["gpu* 1/2/0/3", "cpu 0/0/0/0"]


def test_launchers_tell_their_own_from_anything_else(tmp_path: Path) -> None:
    own = tmp_path / "squeue"
    own.write_text(launchers.launcher_text("squeue", "/opt/py/bin/python"))
    agents = tmp_path / "sinfo"
    agents.write_text('#!/bin/sh\nexec /usr/bin/python3 -s -m gpufleet.slurm sinfo "$@"\n')
    elf = tmp_path / "sbatch"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100)
    wrapper = tmp_path / "scancel"
    wrapper.write_text('#!/bin/sh\nexec /usr/bin/scancel.real "$@"\n')
    renamed = tmp_path / "sacct"
    renamed.write_text(launchers.launcher_text("squeue", "/opt/py/bin/python"))  # names another command
    link = tmp_path / "srun"
    link.symlink_to(own)
    assert launchers.is_launcher(own) and launchers.is_launcher(agents)
    assert not any(launchers.is_launcher(p) for p in (elf, wrapper, renamed, link, tmp_path / "none"))


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpufleet.slurm", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_show_hostnames_asks_no_server_and_imports_no_client() -> None:
    done = _run(
        "scontrol",
        "show",
        "hostnames",
        env={"SLURM_JOB_NODELIST": "gpu-[07-09]", "GPUFLEET_URL": "http://127.0.0.1:9"},
    )
    assert done.returncode == 0 and done.stdout == "gpu-07\ngpu-08\ngpu-09\n"
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    heavy = sorted(
        m
        for m in imported
        if m.split(".")[0] in ("httpx", "typer", "click", "rich", "pydantic", "gpufleet.client")
    )
    assert not heavy and "gpufleet.client" not in imported and "gpufleet.cli" not in imported, heavy
    one = _run("scontrol", "show", "hostnames", "a,b[1-2]")
    assert one.stdout == "a\nb1\nb2\n"
    assert _run("scontrol", "show", "hostlist", "n1,n2,n3,m").stdout == "n[1-3],m\n"
    bad = _run("scontrol", "show", "hostnames", "n[1-")
    assert bad.returncode == 1 and "scontrol: error: invalid hostlist" in bad.stderr
    empty = _run("scontrol", "show", "hostnames", env={"SLURM_JOB_NODELIST": ""})
    assert empty.returncode == 1 and "host list is empty" in empty.stderr


def test_unknown_command_is_usage() -> None:
    done = _run("qsub")
    assert done.returncode == 2 and "usage: python -m gpufleet.slurm {srun,scontrol" in done.stderr
