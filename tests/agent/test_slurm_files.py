"""Slurm batch scripts at home (issue 18), on the agent: ``--output``/``--error``/
``--input`` files with their patterns, opened as the job's account (never through a
link or into a directory the account could not write itself), the working directory
(``--chdir``, the submit dir, the private fallback), the SLURM_* variables, ``--signal``
(to the batch shell only with ``B:``, once per attempt, before the time limit), and the
node's CPUs and memory in the sync. Real jobs run as the test account
(``jobaccounts.py``) through ``ProcessRunner``, as in ``test_runners.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import (
    Agent,
    AgentConfig,
    ContainerRunner,
    JobSpec,
    JobStore,
    LocalJob,
    ProcessRunner,
    SimSpec,
    SimulatedProbe,
    launch_env,
)
from gpufleet.agent.fakedocker import FakeDocker
from gpufleet.agent.jobs import NO_ARRAY_TASK, Peer, slurm_path
from gpufleet.agent.probe import host_resources
from gpufleet.agent.runners import _slurm_args
from gpufleet.api.nodes import NodeSync
from gpufleet.clock import FakeClock
from jobaccounts import JOB_ACCOUNT, PYTHON, ROOT, passable, run_as

ACCOUNT = pwd.getpwnam(JOB_ACCOUNT) if ROOT else pwd.getpwuid(os.getuid())
"""Who the jobs run as: the test account under a root agent, else this user."""
root_only = pytest.mark.skipif(not ROOT, reason="files of another owner need root (CI runs as root)")


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    passable(tmp_path)
    return JobStore(tmp_path / "work")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A directory of the job's account: where it submitted from."""
    d = tmp_path / "home"
    d.mkdir()
    if ROOT:
        os.chown(d, ACCOUNT.pw_uid, ACCOUNT.pw_gid)
    d.chmod(0o755)
    passable(d)
    return d


@pytest.fixture
def runner(store: JobStore) -> Iterator[ProcessRunner]:
    r = ProcessRunner(store, node="n1", run_as=run_as())
    yield r
    for pid in list(r._children):  # what a test left running (a job and what it left behind)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def spec(job_id: int = 7, *command: str, **kw: Any) -> JobSpec:
    base: dict[str, Any] = {"user": "alice", "name": "train"}
    return JobSpec(job_id=job_id, attempt=1, command=command or ("true",), **(base | kw))


def run_to_end(runner: ProcessRunner, job: LocalJob, timeout: float = 5) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = runner.poll(job, now=time.time())
        if code is not None:
            return code
        time.sleep(0.01)
    raise AssertionError("job did not end")


def until(cond: Callable[[], bool], timeout: float = 3) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def owned(path: Path) -> None:
    """A file made by the job's account (root made the file for the test: hand it over)."""
    if ROOT:
        os.chown(path, ACCOUNT.pw_uid, ACCOUNT.pw_gid)


# -- filename patterns ------------------------------------------------------------------------

PEERS = (
    Peer(node="gpu01.example.org", address="10.0.0.1", gpus=(0,)),
    Peer(node="gpu02", address="x", gpus=()),
)


@pytest.mark.parametrize(
    ("pattern", "kw", "want"),
    [
        ("slurm-%j.out", {}, "slurm-7.out"),
        ("%x-%u.%j", {}, "train-alice.7"),
        ("%A_%a.out", {}, f"7_{NO_ARRAY_TASK}.out"),
        ("%A_%a.out", {"array": (100, 3, 8, 0, 7)}, "100_3.out"),
        ("%4a-%b-%12j", {"array": (100, 13, 20, 0, 19)}, "0013-3-0000000007"),
        ("/logs/%N/%n-%t-%s-%J", {"peers": PEERS}, "/logs/gpu01/0-0-batch-7.batch"),
        ("100%%-%q-%", {}, "100%-%q-%"),
        ("a\\%j\\\\b", {}, "a%j\\b"),
    ],
    ids=[
        "job-id",
        "name-user",
        "array-outside-an-array",
        "array-task",
        "widths",
        "node-names",
        "literal",
        "escaped",
    ],
)
def test_filename_patterns_expand_as_slurm_does(pattern: str, kw: dict[str, Any], want: str) -> None:
    assert slurm_path(pattern, spec(**kw), node="n9") == want


def test_only_the_first_node_has_the_files() -> None:
    s = spec(output="o", error="e", input="i", submit_dir="/home/a")
    assert _slurm_args(s, "n1", "/home/a") == [
        "--submit-dir", "/home/a", "--output", "o", "--error", "e", "--input", "i"
    ]  # fmt: skip
    assert _slurm_args(dataclasses.replace(s, node_rank=1), "n2", "/home/a") == ["--submit-dir", "/home/a"]
    assert _slurm_args(spec(output="--", workdir="-w"), "n1", "-w") == [
        "--workdir",
        "./-w",
        "--output",
        "./--",
    ]


# -- files -------------------------------------------------------------------------------------


def test_output_error_and_input_files_are_the_accounts(runner: ProcessRunner, home: Path) -> None:
    (home / "in.txt").write_text("from-input\n")
    script = "cat; echo to-out; echo to-err >&2; exit 3"
    s = spec(
        7,
        "sh",
        "-c",
        script,
        submit_dir=str(home),
        output="out-%j.txt",
        error="err-%x-%a.txt",
        input="in.txt",
    )
    job = runner.start(s, now=time.time())
    assert run_to_end(runner, job) == 3
    out, err = home / "out-7.txt", home / f"err-train-{NO_ARRAY_TASK}.txt"
    assert out.read_text() == "from-input\nto-out\n" and err.read_text() == "to-err\n"
    assert {out.stat().st_uid, err.stat().st_uid} == {ACCOUNT.pw_uid}
    log = job.log_path.read_text()  # gpufleet logs: everything, as before
    assert all(line in log for line in ("from-input\n", "to-out\n", "to-err\n"))
    assert (job.path / "exit_code").read_text().strip() == "3"


@pytest.mark.parametrize("error", [None, "both.out"], ids=["no-error", "error-same-as-output"])
def test_output_alone_gets_both_streams_appended(
    runner: ProcessRunner, home: Path, error: str | None
) -> None:
    (home / "both.out").write_text("earlier attempt\n")
    owned(home / "both.out")
    s = spec(8, "sh", "-c", "echo out; echo err >&2", submit_dir=str(home), output="both.out", error=error)
    job = runner.start(s, now=time.time())
    assert run_to_end(runner, job) == 0
    assert (home / "both.out").read_text() == "earlier attempt\nout\nerr\n"
    assert job.log_path.read_text() == "out\nerr\n"


@root_only
@pytest.mark.parametrize("how", ["link-to-roots-file", "roots-directory", "error-through-link"])
def test_an_output_path_the_account_may_not_write_fails_the_job_unwritten(
    runner: ProcessRunner, home: Path, tmp_path: Path, how: str
) -> None:
    precious = tmp_path / "precious"
    precious.write_text("root's\n")
    precious.chmod(0o644)
    (home / "evil").symlink_to(precious)
    closed = tmp_path / "roots"
    closed.mkdir(mode=0o755)
    target = {
        "link-to-roots-file": "evil",
        "roots-directory": str(closed / "x.out"),
        "error-through-link": None,
    }[how]
    error = "evil" if how == "error-through-link" else None
    s = spec(9, "sh", "-c", "touch ran; echo hello", submit_dir=str(home), output=target, error=error)
    job = runner.start(s, now=time.time())
    assert run_to_end(runner, job) == 127  # not started, as Slurm fails it (issue 31)
    log = job.log_path.read_text()
    assert f"cannot open {'--error' if error else '--output'}" in log and "Permission denied" in log
    assert log.rstrip().endswith("not started") and not (home / "ran").exists()
    assert precious.read_text() == "root's\n" and not (closed / "x.out").exists()


def test_an_input_that_cannot_be_opened_means_the_job_does_not_start(
    runner: ProcessRunner, home: Path
) -> None:
    s = spec(10, "sh", "-c", "touch ran", submit_dir=str(home), input="missing-%j.txt")
    job = runner.start(s, now=time.time())
    assert run_to_end(runner, job) == 127
    assert (
        "cannot open --input missing-10.txt: No such file or directory: not started"
        in job.log_path.read_text()
    )
    assert not (home / "ran").exists()


# -- the working directory ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "want", "note"),
    [
        ({"workdir": "{home}/wd", "submit_dir": "{home}"}, "{home}/wd", None),
        ({"workdir": "wd", "submit_dir": "{home}"}, "{home}/wd", None),
        ({"submit_dir": "{home}"}, "{home}", None),
        ({}, "{run}", None),
        ({"submit_dir": "{home}/not-on-this-node"}, "{run}", "cannot enter the submit directory"),
        ({"submit_dir": "{home}/closed"}, "{run}", "cannot enter the submit directory"),
        (
            {"workdir": "{home}/missing", "submit_dir": "{home}"},
            "{run}",
            "cannot enter the working directory",
        ),
    ],
    ids=[
        "chdir",
        "chdir-relative-to-submit-dir",
        "submit-dir",
        "none",
        "submit-dir-missing",
        "submit-dir-closed",
        "chdir-missing",
    ],
)
def test_the_working_directory(
    runner: ProcessRunner, home: Path, where: dict[str, str], want: str, note: str | None
) -> None:
    for name, mode in (("wd", 0o755), ("closed", 0o000)):
        (home / name).mkdir(mode=mode)
        owned(home / name)
        (home / name).chmod(mode)
    s = spec(11, "sh", "-c", 'echo "cwd=$(pwd -P)"; echo "submit=$SLURM_SUBMIT_DIR"', output="where.out")
    s = dataclasses.replace(s, **{k: v.format(home=home) for k, v in where.items()})  # type: ignore[arg-type]
    job = runner.start(s, now=time.time())
    assert run_to_end(runner, job) == 0
    cwd = Path(os.path.realpath(want.format(home=home, run=job.path / "run")))
    log = job.log_path.read_text()
    assert f"cwd={cwd}\n" in log
    assert f"submit={s.submit_dir or job.path / 'run'}\n" in log
    assert (cwd / "where.out").read_text().startswith("cwd=")  # relative names: in the working dir
    if note is None:
        assert "gpufleet:" not in log
    else:
        assert note in log and f"running in {job.path / 'run'}" in log


def test_slurm_variables() -> None:
    peers = (Peer(node="a", address="a", gpus=(0,)), Peer(node="b", address="b", gpus=(0,)))
    s = spec(
        12,
        peers=peers,
        cpus_per_task=4,
        ntasks_per_node=2,
        cpus_per_node=8,
        mem_per_node_mb=16000,
        submit_dir="/home/alice/p",
        env={"SLURM_CPUS_PER_TASK": "99", "SLURM_MEM_PER_NODE": "1"},
    )
    env = launch_env(s, node="a", checkpoint_dir="/c", hostfile="/h", base={})
    wanted = ("CPU", "TASK", "MEM")
    assert {k: env[k] for k in env if k.startswith("SLURM_") and any(w in k for w in wanted)} == {
        "SLURM_CPUS_PER_TASK": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NTASKS": "4",
        "SLURM_MEM_PER_NODE": "16000",
        "SLURM_CPUS_ON_NODE": "8",
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
    }
    assert env["SLURM_SUBMIT_DIR"] == "/home/alice/p"
    bare = launch_env(spec(12), node="a", checkpoint_dir="/c", hostfile="/h", base={}, submit_dir="/run")
    assert bare["SLURM_SUBMIT_DIR"] == "/run" and bare["SLURM_NTASKS"] == "1"
    assert not {"SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE", "SLURM_CPUS_ON_NODE"} & set(bare)


# -- the wrapper -------------------------------------------------------------------------------


def test_a_job_stopped_while_its_output_is_copied_records_143(runner: ProcessRunner, home: Path) -> None:
    body = "import time; print('before', flush=True); time.sleep(30)"
    job = runner.start(spec(13, PYTHON, "-c", body, submit_dir=str(home), output="o.out"), now=time.time())
    until(lambda: "before" in job.log_path.read_text())
    job = runner.stop(job, now=time.time(), grace_s=30)
    assert run_to_end(runner, job) == 143
    assert (job.path / "exit_code").read_text().strip() == "143"
    assert (home / "o.out").read_text() == "before\n"


def test_a_process_left_behind_does_not_hold_the_job(runner: ProcessRunner, home: Path) -> None:
    """The shell's exit ends the job even though a background process still holds the
    pipe (Slurm ends the job then too); what the shell wrote is all there."""
    job = runner.start(
        spec(14, "sh", "-c", "sleep 3 & echo done", submit_dir=str(home), output="o.out"), now=0.0
    )
    t0 = time.monotonic()
    assert run_to_end(runner, job) == 0
    assert time.monotonic() - t0 < 2
    assert (home / "o.out").read_text() == "done\n" and job.log_path.read_text() == "done\n"


def test_a_process_left_writing_does_not_hold_the_job(runner: ProcessRunner, home: Path) -> None:
    """After the shell's exit the wrapper takes what is in the pipe, not what a process
    left behind goes on writing (which then ends with SIGPIPE)."""
    script = "(while :; do echo x; done) & sleep 0.1; echo done"
    job = runner.start(spec(19, "sh", "-c", script, submit_dir=str(home), output="o.out"), now=0.0)
    t0 = time.monotonic()
    assert run_to_end(runner, job) == 0
    assert time.monotonic() - t0 < 2
    assert "done\n" in (home / "o.out").read_text() and "done\n" in job.log_path.read_text()


def test_a_job_gets_sigpipe_back(runner: ProcessRunner) -> None:
    """Python ignores SIGPIPE; an ignored signal survives exec, so ``yes | head`` would
    end in EPIPE errors instead of quietly."""
    job = runner.start(spec(15, "sh", "-c", "yes | head -n 1"), now=0.0)
    assert run_to_end(runner, job) == 0
    assert job.log_path.read_text() == "y\n"


# -- --signal ----------------------------------------------------------------------------------

SHELL = """trap 'echo shell >> "$MARKS"' USR1
"$PY" -c "$CHILD" &
wait; wait
"""
CHILD = """import os, signal, sys, time
def on(*_):
    open(os.environ["MARKS"], "a").write("child\\n")
    sys.exit(0)
signal.signal(signal.SIGUSR1, on)
open(os.environ["READY"], "w").close()
time.sleep(3)
"""


@pytest.mark.parametrize(
    ("batch_only", "want"), [(True, ["shell"]), (False, ["child", "shell"])], ids=["B", "all"]
)
def test_signal_reaches_the_batch_shell_or_every_process(
    runner: ProcessRunner, home: Path, batch_only: bool, want: list[str]
) -> None:
    marks, ready = home / "marks", home / "ready"
    env = {"MARKS": str(marks), "READY": str(ready), "PY": PYTHON, "CHILD": CHILD}
    job = runner.start(spec(16, "sh", "-c", SHELL, env=env, submit_dir=str(home), output="o.out"), now=0.0)
    until(ready.exists)
    assert runner.send_signal(job, signum=signal.SIGUSR1, batch_only=batch_only) is None
    until(lambda: marks.exists() and len(marks.read_text().split()) >= len(want))
    if batch_only:
        time.sleep(0.1)  # the child would have said so by now
        assert sorted(marks.read_text().split()) == want
        job = runner.stop(job, now=0.0, grace_s=30)
        assert run_to_end(runner, job) == 143
    else:
        assert run_to_end(runner, job) == 0  # the wrapper noted USR1 and recorded the code
        assert sorted(marks.read_text().split()) == want
    whom = "the batch shell" if batch_only else "every process of the job"
    assert f"gpufleet: sent SIGUSR1 to {whom} (--signal)" in job.log_path.read_text()


class _NoServer:
    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no sync in this test")

    def close(self) -> None:
        pass


def _agent(store: JobStore, runner: ProcessRunner, clock: FakeClock, work: Path) -> Agent:
    return Agent(
        config=AgentConfig(node="n1", work_dir=work),
        probe=SimulatedProbe(node="n1", spec=SimSpec(gpus=1), clock=clock),
        transport=_NoServer(),
        runners={"process": runner},
        store=store,
        clock=clock,
    )


def _desired(deadline: float | None, marks: Path, home: Path) -> dict[str, Any]:
    script = """trap 'echo usr1 >> "$MARKS"' USR1; echo ready
i=0; while [ $i -lt 60 ]; do sleep 0.05; i=$((i+1)); done"""
    return {
        "job_id": 17,
        "attempt": 1,
        "name": "sig",
        "command": ["sh", "-c", script],
        "env": {"MARKS": str(marks)},
        "image": None,
        "gpus": [],
        "time_limit_s": 60,
        "deadline": deadline,
        "user": "alice",
        "output": None,
        "error": None,
        "submit_dir": str(home),
        "signal": "B:USR1@5",
    }


def test_the_agent_sends_the_signal_once_before_the_time_limit(
    store: JobStore, runner: ProcessRunner, home: Path, tmp_path: Path
) -> None:
    clock = FakeClock()
    marks = home / "marks"
    agent = _agent(store, runner, clock, tmp_path / "work")
    try:
        agent.apply(
            {"node": "n1", "jobs": [_desired(None, marks, home)]}, sent={}
        )  # started: no deadline yet
        (job,) = agent.jobs.values()
        until(lambda: "ready" in job.log_path.read_text())
        deadline = clock.now() + 10  # the server knows it once the job runs
        agent.apply({"node": "n1", "jobs": [_desired(deadline, marks, home)]}, sent={})
        assert agent.jobs[job.key].deadline == deadline and agent.jobs[job.key].signal == "B:USR1@5"
        clock.advance(4.9)
        agent.tick()
        assert agent.jobs[job.key].signal_sent_at is None
        clock.advance(0.2)  # 4.9 s left: at most 5
        agent.tick()
        assert agent.jobs[job.key].signal_sent_at == clock.now()
        until(marks.exists)
        clock.advance(1)
        agent.tick()
        (saved,) = store.load_all()
        assert saved.signal_sent_at is not None
    finally:
        agent.close()
    again = _agent(store, ProcessRunner(store, node="n1", run_as=run_as()), clock, tmp_path / "work")
    try:
        assert again.restore() == 1  # a restarted agent: the record says it was sent
        again.tick()
        time.sleep(0.2)
        assert marks.read_text() == "usr1\n"
        assert job.log_path.read_text().count("sent SIGUSR1") == 1
    finally:
        again.close()
        with contextlib.suppress(OSError):
            os.killpg(agent.jobs[job.key].pid or 0, signal.SIGKILL)


def test_a_container_is_signalled_through_the_engine(store: JobStore) -> None:
    fake = FakeDocker()
    runner = ContainerRunner(store, node="n1", client=fake)
    job = runner.start(spec(18, image="busybox", signal="B:USR1@60"), now=0.0)
    assert runner.send_signal(job, signum=signal.SIGUSR1, batch_only=True) is None
    assert fake.ran[job.container or ""].kills == ["SIGUSR1"]
    gone = dataclasses.replace(job, container="no-such-container")
    assert runner.send_signal(gone, signum=signal.SIGUSR1, batch_only=False) == "no such container"


# -- the node's CPUs and memory ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sim", "cpus", "memory_mb"),
    [(SimSpec(gpus=8), 64, 512 * 1024), (SimSpec(gpus=2, cpus=12, node_memory_mb=96_000), 12, 96_000)],
    ids=["defaults", "configured"],
)
def test_the_sync_reports_the_nodes_cpus_and_memory(
    store: JobStore, tmp_path: Path, sim: SimSpec, cpus: int, memory_mb: int
) -> None:
    agent = Agent(
        config=AgentConfig(node="n1", work_dir=tmp_path / "work"),
        probe=SimulatedProbe(node="n1", spec=sim),
        transport=_NoServer(),
        runners={},
        store=store,
    )
    try:
        body = agent.build_sync()
    finally:
        agent.close()
    assert (body["cpus"], body["memory_mb"]) == (cpus, memory_mb)
    assert NodeSync.model_validate(body).cpus == cpus


def test_this_machine_has_cpus_and_memory() -> None:
    cpus, memory_mb = host_resources()
    assert cpus is not None and cpus >= 1 and memory_mb is not None and memory_mb > 0
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        NodeSync(cpus=-1)
