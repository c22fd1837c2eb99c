"""Runners with real child processes (env, logs, exit codes, SIGTERM -> SIGKILL,
re-adoption after an agent restart) and the simulated runner; containers are in
``test_container.py``, accounts and isolation in ``test_isolation.py``."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from gpufleet.agent import (
    JobSpec,
    JobStore,
    LocalJob,
    ProcessRunner,
    SimulatedRunner,
    launch_env,
    read_chunk,
)
from gpufleet.agent.jobs import Peer
from gpufleet.agent.runners import VANISHED
from jobaccounts import PYTHON, passable, run_as

PY = PYTHON


def spec(job_id: int = 7, *command: str, attempt: int = 1, **kw: object) -> JobSpec:
    return JobSpec(job_id=job_id, attempt=attempt, command=command or ("true",), **kw)  # type: ignore[arg-type]


def run_to_end(runner: ProcessRunner, job: LocalJob, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = runner.poll(job, now=time.time())
        if code is not None:
            return code
        time.sleep(0.02)
    raise AssertionError("job did not end")


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    passable(tmp_path)  # jobs run as an unprivileged account: it must reach its directories
    return JobStore(tmp_path / "work")


def test_process_gets_exactly_its_gpus_and_env(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_TOKEN", "secret")  # the agent's own credential must not leak
    runner = ProcessRunner(store, node="n1", run_as=run_as())
    script = (
        "import os;"
        "keys='CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES GPUFLEET_JOB_ID GPUFLEET_CHECKPOINT_DIR "
        "MASTER_ADDR MASTER_PORT WORLD_SIZE NODE_RANK GPUFLEET_NODES MINE GPUFLEET_TOKEN'.split();"
        "[print(k+'='+os.environ.get(k,'-')) for k in keys]; print('cwd='+os.getcwd())"
    )
    s = spec(7, PY, "-c", script, gpus=(1, 3), env={"MINE": "yes", "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    job = runner.start(s, now=time.time())
    assert run_to_end(runner, job) == 0
    out = dict(line.split("=", 1) for line in job.log_path.read_text().splitlines())
    assert out["CUDA_VISIBLE_DEVICES"] == "1,3" and out["NVIDIA_VISIBLE_DEVICES"] == "1,3"
    assert out["GPUFLEET_JOB_ID"] == "7" and out["MINE"] == "yes" and out["GPUFLEET_TOKEN"] == "-"
    assert out["GPUFLEET_CHECKPOINT_DIR"] == str(store.checkpoint_dir(7))
    assert out["cwd"] == str(job.path / "run")
    again = runner.start(dataclasses.replace(s, attempt=2), now=time.time())
    run_to_end(runner, again)
    assert f"GPUFLEET_CHECKPOINT_DIR={store.checkpoint_dir(7)}" in again.log_path.read_text()


@pytest.mark.parametrize(
    ("command", "code", "text"),
    [
        ((PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"), 3, "out\nerr\n"),
        (("/nonexistent/binary",), 127, "cannot start"),
        ((PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"), 143, ""),
    ],
    ids=["exit-3-with-both-streams", "command-not-found", "killed-by-signal"],
)
def test_exit_codes_and_logs(store: JobStore, command: tuple[str, ...], code: int, text: str) -> None:
    runner = ProcessRunner(store, node="n1", run_as=run_as())
    job = runner.start(spec(8, *command), now=time.time())
    assert run_to_end(runner, job) == code
    assert text in job.log_path.read_text()
    assert (job.path / "exit_code").read_text().strip() == str(code)


@pytest.mark.parametrize(
    ("ignores_term", "want"),
    [(False, 143), (True, 137)],
    ids=["sigterm-suffices", "sigkill-after-grace"],
)
def test_stop_escalates_from_sigterm_to_sigkill(store: JobStore, ignores_term: bool, want: int) -> None:
    runner = ProcessRunner(store, node="n1", run_as=run_as())
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignores_term else ""
    body = f"import signal, time; {ignore}print('ready', flush=True); time.sleep(60)"
    job = runner.start(spec(9, PY, "-c", body), now=0.0)
    deadline = time.monotonic() + 10
    while "ready" not in job.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    job = runner.stop(job, now=100.0, grace_s=30)
    assert job.stop_requested_at == 100.0
    time.sleep(0.5)
    if ignores_term:
        assert runner.poll(job, now=101.0) is None  # still alive within the grace period
        job = runner.stop(job, now=110.0, grace_s=30)
        assert not job.killed and runner.poll(job, now=110.0) is None
        job = runner.stop(job, now=131.0, grace_s=30)
        assert job.killed
    assert run_to_end(runner, job) == want


def test_restarted_runner_adopts_a_running_job_and_reads_its_exit_code(store: JobStore) -> None:
    first = ProcessRunner(store, node="n1", run_as=run_as())
    job = first.start(spec(10, PY, "-c", "import time, sys; time.sleep(1.0); sys.exit(4)"), now=time.time())
    store.save(job)
    (saved,) = store.load_all()
    second = ProcessRunner(store, node="n1", run_as=run_as())  # a new agent process: not the job's parent
    assert saved == job and second.poll(saved, now=time.time()) is None
    assert run_to_end(second, saved) == 4


def test_an_agent_killed_while_starting_a_job_finds_it_after_its_restart(store: JobStore) -> None:
    """The record is written before the wrapper starts: an agent killed before it could
    record the pid reads back a record without one, and ``recover`` finds the wrapper
    (the restarted agent holds the attempt, so it never starts it a second time)."""
    first = ProcessRunner(store, node="n1", run_as=run_as())
    code = "import time, sys; time.sleep(1.0); sys.exit(5)"
    started = first.start(spec(12, PY, "-c", code), now=time.time())
    (intent,) = store.load_all()  # the agent "died" before saving ``started``
    assert intent.pid is None and intent.key == started.key
    second = ProcessRunner(store, node="n1", run_as=run_as())
    found = second.recover(intent)
    assert found.pid == started.pid and found.create_time is not None
    assert second.poll(found, now=time.time()) is None
    assert run_to_end(second, found) == 5


def test_a_job_recorded_but_never_started_is_reported_lost(store: JobStore) -> None:
    runner = ProcessRunner(store, node="n1", run_as=run_as())
    intent = LocalJob(
        job_id=13, attempt=2, kind="process", gpus=(0,), dir=str(store.job_dir(13, 2)), started_at=0.0
    )
    assert runner.recover(intent) == intent
    # lost: the server requeues the job as a new attempt (at most once, never twice)
    assert runner.poll(intent, now=time.time()) == VANISHED


def test_a_reused_pid_is_not_mistaken_for_the_job(store: JobStore, tmp_path: Path) -> None:
    runner = ProcessRunner(store, node="n1", run_as=run_as())
    ghost = LocalJob(
        job_id=11,
        attempt=1,
        kind="process",
        gpus=(0,),
        dir=str(tmp_path / "ghost"),
        started_at=0.0,
        pid=os.getpid(),  # alive, but created at another time than recorded
        create_time=1.0,
    )
    assert runner.poll(ghost, now=time.time()) == VANISHED  # reported "lost": the job is requeued


def test_simulated_runner_holds_its_gpus_for_the_duration(store: JobStore) -> None:
    runner = SimulatedRunner(store)
    job = runner.start(
        spec(12, gpus=(0, 1), env={"GPUFLEET_SIMULATE_S": "30", "GPUFLEET_SIMULATE_UTIL": "0.7"}), now=100.0
    )
    assert (job.simulate_s, job.util, job.gpus) == (30.0, 0.7, (0, 1))
    assert runner.poll(job, now=129.0) is None and runner.poll(job, now=130.0) == 0
    stopped = runner.stop(job, now=110.0, grace_s=30)
    assert runner.poll(stopped, now=110.0) == 143


def test_launch_env_for_a_multi_node_job() -> None:
    peers = (Peer(node="a", address="10.0.0.1", gpus=(0, 1)), Peer(node="b", address="10.0.0.2", gpus=(4, 5)))
    s = spec(
        21, gpus=(4, 5), peers=peers, node_rank=1, master_addr="10.0.0.1", master_port=20021, world_size=4
    )
    env = launch_env(s, node="b", checkpoint_dir="/ck", hostfile="/hf", base={"PATH": "/bin"})
    assert {
        k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "GPUFLEET_NODES")
    } == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "20021",
        "WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "GPUFLEET_NODES": "10.0.0.1,10.0.0.2",
    }
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "a,b"
    far = (
        Peer(node="gpu-12", address="x", gpus=(0,)),
        *(Peer(node=f"gpu-{i:02d}", address="x", gpus=(0,)) for i in (7, 8, 9)),
    )
    assert (
        launch_env(spec(22, peers=far), node="gpu-12", checkpoint_dir="/ck", hostfile="/hf", base={})[
            "SLURM_JOB_NODELIST"
        ]
        == "gpu-12,gpu-[07-09]"
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5" and env["GPUFLEET_NNODES"] == "2" and env["PATH"] == "/bin"


@pytest.mark.parametrize(
    ("data", "limit", "want_end", "want_text"),
    [
        (b"one\ntwo\nthree", 100, 13, "one\ntwo\nthree"),
        (b"one\ntwo\nthree", 10, 8, "one\ntwo\n"),
        ("h\u00e9llo".encode() * 3, 8, 7, "h\u00e9llo"[:4] + "l"),
    ],
    ids=["all", "cut-at-newline", "cut-at-utf8-boundary"],
)
def test_read_chunk(tmp_path: Path, data: bytes, limit: int, want_end: int, want_text: str) -> None:
    path = tmp_path / "log"
    path.write_bytes(data)
    end, text = read_chunk(path, 0, limit) or (0, "")
    assert end == want_end and data[:end].decode() == text
    assert text.startswith(want_text[:3])
