"""The agent's side of job steps (``agent/steps.py``) that needs no server: each task's
Slurm variables and GPUs, what a multi-node job's other nodes run, and how a task's
output is cut into the sync's pieces (whole lines while it runs, its exit only with the
piece that reaches the end of its output)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.jobs import JobSpec, launch_env
from gpufleet.agent.steps import EVERY_NODE_ENV, HOLD, StepTask, StepTasks, prepare_job, task_env
from gpufleet.api.steps import DesiredStep, StepAck

STEP = DesiredStep(
    step=3,
    command=["true"],
    env={},
    procids=[2, 3],
    node_index=1,
    ntasks=4,
    nodes=["a", "b"],
    tasks_per_node=[2, 2],
    gpus_per_task=2,
)


@pytest.mark.parametrize(
    ("procid", "localid", "gpus"),
    [(2, 0, "0,1"), (3, 1, "2,3")],
    ids=["first-task-here", "second-task-here"],
)
def test_task_env(procid: int, localid: int, gpus: str) -> None:
    env = task_env(
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, STEP, procid=procid, localid=localid, visible=list("0123")
    )
    assert {k: env[k] for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID")} == {
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": "1",
        "SLURM_STEP_ID": "3",
    }
    assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == env["SLURM_STEP_NUM_TASKS"] == "4"
    assert env["SLURM_STEP_NODELIST"] == "a,b" and env["SLURM_STEP_TASKS_PER_NODE"] == "2,2"
    assert env["CUDA_VISIBLE_DEVICES"] == gpus


def test_too_few_gpus_for_gpus_per_task_leave_the_nodes() -> None:
    env = task_env({"CUDA_VISIBLE_DEVICES": "0"}, STEP, procid=3, localid=1, visible=["0"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(
    ("rank", "kind", "service", "runs"),
    [
        (0, "process", False, ("python", "train.py")),
        (1, "process", False, ("/bin/sleep", *HOLD[1:])),
        (1, "process", True, ("python", "train.py")),
        (1, "container", False, ("python", "train.py")),
    ],
    ids=["batch-host", "other-node-holds", "replica", "container"],
)
def test_the_batch_script_runs_on_the_first_node_only(
    rank: int, kind: str, service: bool, runs: tuple[str, ...]
) -> None:
    spec = JobSpec(job_id=1, attempt=1, command=("python", "train.py"), node_rank=rank, credential="gfj.x")
    got = prepare_job(
        spec,
        kind=kind,
        service=service,
        server_url="http://s",
        ca_file="",
        slurm_bin="/w/bin",
        sleep="/bin/sleep",
    )
    assert got.command == runs
    env = launch_env(got, node="n", checkpoint_dir="/c", hostfile="/h", base={"PATH": "/usr/bin"})
    if kind == "process":
        assert env["PATH"] == "/w/bin:/usr/bin" and env["GPUFLEET_TOKEN"] == "gfj.x"
        assert env["GPUFLEET_URL"] == "http://s"
    else:
        assert "GPUFLEET_TOKEN" not in env and env["PATH"] == "/usr/bin"


def test_gpufleet_runs_command_runs_on_every_node() -> None:
    spec = JobSpec(job_id=1, attempt=1, command=("hostname",), node_rank=1, env={EVERY_NODE_ENV: "1"})
    got = prepare_job(spec, kind="process", service=False, server_url="", ca_file="", slurm_bin="", sleep="s")
    assert got.command == ("hostname",)


def test_a_jobs_own_path_and_token_never_shadow_the_nodes() -> None:
    spec = JobSpec(job_id=1, attempt=1, env={"PATH": "/mine:/w/bin", "GPUFLEET_TOKEN": "forged"})
    spec = prepare_job(
        spec,
        kind="process",
        service=False,
        server_url="http://s",
        ca_file="/ca",
        slurm_bin="/w/bin",
        sleep="s",
    )
    spec = dataclasses.replace(spec, credential="gfj.real")
    env = launch_env(spec, node="n", checkpoint_dir="/c", hostfile="/h", base={})
    assert env["PATH"] == "/w/bin:/mine" and env["GPUFLEET_TOKEN"] == "gfj.real"
    assert env["GPUFLEET_CA_FILE"] == "/ca"


class NoRunner:
    """``StepTasks`` needs a runner only to start tasks; these tests start none."""


def _tasks(tmp_path: Path, out: bytes, *, exit_code: int | None) -> tuple[StepTasks, StepTask]:
    tasks = StepTasks(work_dir=tmp_path, node="n", runner=NoRunner(), watch=lambda pid: None)  # type: ignore[arg-type]
    task = StepTask(job_id=7, attempt=1, step=0, procid=0, dir=tmp_path / "t", exit_code=exit_code)
    task.dir.mkdir()
    task.log.write_bytes(out)
    tasks.tasks[task.key] = task
    return tasks, task


@pytest.mark.parametrize(
    ("out", "exit_code", "want"),
    [
        (b"one\ntw", None, [{"state": "running", "data": "one\n", "offset": 0, "end": 4}]),
        (b"partial", None, []),
        (b"one\ntw", 3, [{"state": "exited", "data": "one\ntw", "exit_code": 3, "end": 6}]),
        (b"", 0, [{"state": "exited", "data": "", "exit_code": 0, "end": 0}]),
    ],
    ids=["whole-lines-while-running", "no-line-yet", "exit-with-the-rest", "exit-without-output"],
)
def test_report(tmp_path: Path, out: bytes, exit_code: int | None, want: list[dict[str, Any]]) -> None:
    tasks, _ = _tasks(tmp_path, out, exit_code=exit_code)
    got = tasks.report()
    assert [{k: g[k] for k in w} for g, w in zip(got, want, strict=True)] == want


def test_an_acknowledged_exit_forgets_the_task_and_an_unacknowledged_one_is_not_resent(
    tmp_path: Path,
) -> None:
    tasks, task = _tasks(tmp_path, b"x\n", exit_code=0)
    sent = tasks.report()
    tasks.acked([StepAck(job_id=7, step=0, procid=0, end=2, done=True)], sent=sent)
    assert not tasks.tasks and not task.dir.exists()
    again = tmp_path / "again"
    again.mkdir()
    tasks, task = _tasks(again, b"x\n", exit_code=0)
    sent = tasks.report()
    tasks.acked([], sent=sent)  # the server does not take it (its step is gone)
    assert not tasks.tasks and not tasks.pending()


def test_node_lists_are_slurms_compressed_hostlists_in_placement_order() -> None:
    """Slurm's form (``node-[001-002]``), the batch host first as placed: ``scontrol show
    hostnames $SLURM_JOB_NODELIST | head -n1`` names it."""
    step = STEP.model_copy(
        update={"nodes": ["node-003", "node-001", "node-002"], "tasks_per_node": [1, 1, 2]}
    )
    env = task_env({}, step, procid=2, localid=0, visible=[])
    assert env["SLURM_STEP_NODELIST"] == env["SLURM_NODELIST"] == "node-[003,001-002]"
