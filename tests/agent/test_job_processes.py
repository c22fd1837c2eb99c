"""Issue 29, findings 5 and 10: a job is all its processes, and its limits hold on the
cgroup hierarchy the node has (this suite's machine may be v1, v2 or have none usable).

A job that leaves a ``setsid`` process and a double-forked daemon behind, cancelled or
ending by itself: the runner reports it over only once none of them is left (before the
fix its process group alone was signalled and the leftovers kept running, with the
job's GPUs in their environment). With a cgroup (v1 here: memory, pids, freezer) a job
over its memory limit is killed and a thread bomb stops at its pids limit. Without any
usable hierarchy the agent says so, and the node's page and ``gpufleet nodes`` show it."""

from __future__ import annotations

import dataclasses
import os
import pwd
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from agent.fake_nvml import FakeGpu, FakeNvml
from gpufleet.agent import (
    AgentConfig,
    Cgroups,
    HttpTransport,
    JobSpec,
    JobStore,
    Limits,
    LocalJob,
    NvmlProbe,
    ProcessRunner,
    SimSpec,
    SimulatedProbe,
    make_agent,
)
from gpufleet.agent.cgroups import marked, members
from jobaccounts import JOB_ACCOUNT, PYTHON, ROOT, passable, run_as
from server.conftest import Server, make_pool, ok, unique

root_only = pytest.mark.skipif(not ROOT, reason="cgroups and other accounts need root")
LEAVE_BEHIND = (
    "setsid sh -c 'exec sleep 300' & "  # a new session: out of the job's process group
    "sh -c 'sleep 301 & exit 0' & "  # a double fork: its parent gone, reparented to init
    "sleep 0.3; echo started; "
)


def _cgroups() -> Cgroups | None:
    groups = Cgroups(Path("/sys/fs/cgroup/gpufleet-test"))
    return None if groups.mode == "none" else groups


def _runner(tmp_path: Path, *, cgroups: bool, limits: Limits = Limits()) -> ProcessRunner:
    passable(tmp_path)
    groups = _cgroups() if cgroups else None
    if cgroups and groups is None:
        pytest.skip("no usable cgroup hierarchy on this machine")
    return ProcessRunner(
        JobStore(tmp_path / "work"), node=unique("np"), run_as=run_as(), cgroups=groups, limits=limits
    )


def _left(job: LocalJob) -> set[int]:
    return marked(str(job.path / "hostfile")) | members(job.cgroup)


def _end(runner: ProcessRunner, job: LocalJob, *, stop: bool, timeout: float = 15) -> int:
    """Poll (stopping with a short grace when asked) until the runner reports the end;
    at that moment nothing of the job may be left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stop:
            job = runner.stop(job, now=time.monotonic(), grace_s=0.5)
        code = runner.poll(job, now=time.monotonic())
        if code is not None:
            assert _left(job) == set(), "reported over while processes of the job still run"
            return code
        time.sleep(0.05)
    raise AssertionError("the job was never reported over")


def _started(job: LocalJob, word: str = "started") -> None:
    deadline = time.monotonic() + 10
    while word not in job.log_path.read_text():
        assert time.monotonic() < deadline, job.log_path.read_text()
        time.sleep(0.05)


@root_only
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "no-cgroup-marked-sweep"])
def test_a_cancelled_job_leaves_no_process_behind(tmp_path: Path, cgroups: bool) -> None:
    runner = _runner(tmp_path, cgroups=cgroups)
    job = runner.start(JobSpec(job_id=5, attempt=1, command=("sh", "-c", LEAVE_BEHIND + "sleep 300")), now=0)
    _started(job)
    assert len(_left(job)) >= 3  # the shell, the setsid sleep, the orphaned sleep (at least)
    _end(runner, job, stop=True)
    runner.release(job)


@root_only
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "no-cgroup-marked-sweep"])
def test_a_job_that_ends_leaves_no_process_behind(tmp_path: Path, cgroups: bool) -> None:
    runner = _runner(tmp_path, cgroups=cgroups)
    job = runner.start(JobSpec(job_id=6, attempt=1, command=("sh", "-c", LEAVE_BEHIND + "exit 0")), now=0)
    assert _end(runner, job, stop=False) == 0
    assert "started" in job.log_path.read_text()
    runner.release(job)


@root_only
def test_a_job_over_its_memory_limit_is_killed(tmp_path: Path) -> None:
    runner = _runner(tmp_path, cgroups=True, limits=Limits(memory_max_bytes=256 << 20))
    grab = "b = b'x' * (600 << 20); print('allocated', len(b), flush=True)"
    job = runner.start(JobSpec(job_id=7, attempt=1, command=(PYTHON, "-c", grab)), now=0)
    code = _end(runner, job, stop=False, timeout=60)
    assert code == 137 and "allocated" not in job.log_path.read_text()
    runner.release(job)


@root_only
def test_a_thread_bomb_stops_at_the_pids_limit(tmp_path: Path) -> None:
    runner = _runner(tmp_path, cgroups=True, limits=Limits(pids_max=64))
    bomb = (
        "import threading, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(300):\n"
        "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n"
        "    pass\n"
        "print('threads', n, flush=True)\n"
    )
    job = runner.start(JobSpec(job_id=8, attempt=1, command=(PYTHON, "-c", bomb)), now=0)
    _end(runner, job, stop=False, timeout=30)
    (line,) = [ln for ln in job.log_path.read_text().splitlines() if ln.startswith("threads")]
    assert int(line.split()[1]) < 64
    runner.release(job)


def test_a_node_that_cannot_enforce_limits_says_so_on_the_page(server: Server, tmp_path: Path) -> None:
    node = unique("nolimits")
    with server.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": make_pool(server), "gpus": []}))
        token = str(ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"])
    groups = Cgroups(tmp_path / "gpufleet", mount=tmp_path)  # no hierarchy there: mode "none"
    config = AgentConfig(node=node, work_dir=tmp_path / "work", address="127.0.0.1")
    agent = make_agent(
        config=config,
        probe=SimulatedProbe(node=node, spec=SimSpec(gpus=1)),
        transport=HttpTransport(server.url, token),
        cgroups=groups,
    )
    try:
        assert agent.sync_once()
        with server.client() as c:
            said = ok(c.get(f"/nodes/{node}"))["warning"]
            (shown,) = [n for n in ok(c.get("/fleet/snapshot"))["nodes"] if n["name"] == node]
        assert said == groups.disabled_reason and "memory/pids limits" in said
        assert shown["warning"] == said
        agent.warning = lambda: None  # the agent no longer says it: cleared
        assert agent.sync_once()
        with server.client() as c:
            assert ok(c.get(f"/nodes/{node}"))["warning"] is None
    finally:
        agent.close()


class NoServer:
    def sync(self, node: str, body: dict[str, object]) -> dict[str, object]:
        raise AssertionError("no sync in this test")

    def close(self) -> None:
        pass


@root_only
def test_what_nvml_still_lists_of_the_jobs_account_is_killed_before_its_end(tmp_path: Path) -> None:
    """A process of the job's account on the job's GPU that escaped its cgroup and mark
    (here: started outside the job altogether) is killed, and the job is reported over
    only at the tick after."""
    uid = pwd.getpwnam(JOB_ACCOUNT).pw_uid
    stray = subprocess.Popen(["sleep", "60"], user=uid)
    bystander = subprocess.Popen(["sleep", "60"])  # root's, on the same GPU: not the job's
    try:
        gpu = FakeGpu(processes=[stray.pid, bystander.pid])
        config = AgentConfig(node="n1", work_dir=tmp_path / "w", address="127.0.0.1")
        agent = make_agent(config=config, probe=NvmlProbe(FakeNvml([gpu])), transport=NoServer())
        d = tmp_path / "w" / "jobs" / "9-1"
        d.mkdir(parents=True)
        job = LocalJob(job_id=9, attempt=1, kind="simulated", gpus=(0,), dir=str(d), started_at=0.0)
        agent.jobs[job.key] = dataclasses.replace(job, uid=uid, simulate_s=0.0)
        agent.tick()
        assert agent.jobs[job.key].exit_code is None  # not yet: its leftover was just killed
        assert stray.wait(5) == -9 and bystander.poll() is None
        gpu.processes = [bystander.pid]  # the driver no longer lists the killed one
        agent.tick()
        assert agent.jobs[job.key].exit_code == 0
    finally:
        for p in (stray, bystander):
            p.kill()
            p.wait()


def _unmarked(tag: str) -> set[int]:
    """The processes running ``sleep TAG`` (no job mark: started with ``env -i``)."""
    return {p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", tag]}


@root_only
@pytest.mark.parametrize("stop", [False, True], ids=["ends", "cancelled"])
def test_without_a_cgroup_the_wrapper_reaps_what_hid_its_mark(tmp_path: Path, stop: bool) -> None:
    """A daemon started with an empty environment carries no mark for the sweep: the
    wrapper, the job's subreaper, ends it."""
    tag = str(3000 + os.getpid() % 1000 + (500 if stop else 0))
    runner = _runner(tmp_path, cgroups=False)
    script = f"setsid env -i sleep {tag} & sleep 0.3; echo started; " + ("sleep 300" if stop else "exit 0")
    job = runner.start(JobSpec(job_id=11, attempt=1, command=("sh", "-c", script)), now=0)
    _started(job)
    _end(runner, job, stop=stop)
    assert _unmarked(tag) == set()
    runner.release(job)
